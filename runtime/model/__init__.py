"""The model: its config, finding and loading weights, weight formats and linear layers, the shared decoder, the
runner, CUDA graphs."""
