# meshplan plan: dp8 zero1x4 tp8sp pp4(interleaved-1f1b,v2) cp1 mb1 ckpt=sel:all on 256 GPUs (32 nodes x 8)
# torchtitan 0.3.0: --module/--config name a config_registry function; the options below override it
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nnodes 32 --nproc-per-node 8 -m torchtitan.train \
  --module llama3 --config llama3_70b \
  --training.seq_len 8192 \
  --training.global_batch_size 256 \
  --training.local_batch_size 32 \
  --training.mixed_precision_param bfloat16 \
  --parallelism.data_parallel_replicate_degree 2 \
  --parallelism.data_parallel_shard_degree 4 \
  --parallelism.fsdp_reshard_after_forward never \
  --parallelism.tensor_parallel_degree 8 \
  --parallelism.pipeline_parallel_degree 4 \
  --parallelism.pipeline_parallel_schedule Interleaved1F1B \
  --parallelism.pipeline_parallel_microbatch_size 1 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 1 \
  --parallelism.module_fqns_per_model_part tok_embeddings,layers.0,layers.1,layers.2,layers.3,layers.4,layers.5,layers.6,layers.7,layers.8,layers.9 layers.10,layers.11,layers.12,layers.13,layers.14,layers.15,layers.16,layers.17,layers.18,layers.19 layers.20,layers.21,layers.22,layers.23,layers.24,layers.25,layers.26,layers.27,layers.28,layers.29 layers.30,layers.31,layers.32,layers.33,layers.34,layers.35,layers.36,layers.37,layers.38,layers.39 layers.40,layers.41,layers.42,layers.43,layers.44,layers.45,layers.46,layers.47,layers.48,layers.49 layers.50,layers.51,layers.52,layers.53,layers.54,layers.55,layers.56,layers.57,layers.58,layers.59 layers.60,layers.61,layers.62,layers.63,layers.64,layers.65,layers.66,layers.67,layers.68,layers.69 layers.70,layers.71,layers.72,layers.73,layers.74,layers.75,layers.76,layers.77,layers.78,layers.79,norm,lm_head \
  --training.disable_cuda_graphs \
  activation_checkpoint:selective
