"""deepspeed.moe (DeepSpeed's expert-parallel MoE layer) is not supported by
zinf: importing it raises, naming what does work. transformers' own MoE
models (Mixtral, Qwen3-MoE, ...) train on zinf unchanged, each block's
experts inside that block's unit."""
raise ImportError("zinf.deepspeed.moe: DeepSpeed's expert-parallel MoE layer (deepspeed.moe.layer.MoE) is not "
                  "supported by zinf, which runs data-parallel ZeRO stages 0-3; build the model with transformers' "
                  "MoE architectures (Mixtral, Qwen3-MoE), which train on zinf as they are, or run this script with "
                  "DeepSpeed itself")
