"""From logits to text: decoding, strict completeness, sampling and penalties, logprobs, grammar bitmasks,
detokenizing."""
