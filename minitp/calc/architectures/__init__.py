"""Models beyond the dense GPT: a mixture of experts (`moe`) and a vision-language model's
encoder (`vision`: params, bytes, FLOPs of its layouts; `vision_time`: their seconds and the
crossover width; `vision_stage`: the encoder on a pipeline stage of its own)."""
