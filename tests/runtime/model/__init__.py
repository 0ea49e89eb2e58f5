"""Tests of runtime/model/: decoder layers, model families, weight formats, quantized linears."""
