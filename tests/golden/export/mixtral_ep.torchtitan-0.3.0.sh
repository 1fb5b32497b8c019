# meshplan plan: dp8 fsdp8 tp2sp pp2(1f1b) cp1 ep8 mb1 layers=15,17 on 32 GPUs (4 nodes x 8)
# torchtitan 0.3.0: --module/--config name a config_registry function; the options below override it
# torchtitan 0.3.0 has no config function for mixtral-8x7b: replace MODULE/CONFIG with one that builds this model
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nnodes 4 --nproc-per-node 8 -m torchtitan.train \
  --module MODULE --config CONFIG \
  --training.seq_len 4096 \
  --training.global_batch_size 64 \
  --training.local_batch_size 8 \
  --training.mixed_precision_param bfloat16 \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 8 \
  --parallelism.fsdp_reshard_after_forward always \
  --parallelism.tensor_parallel_degree 2 \
  --parallelism.pipeline_parallel_degree 2 \
  --parallelism.pipeline_parallel_schedule 1F1B \
  --parallelism.pipeline_parallel_microbatch_size 1 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 8 \
  --parallelism.module_fqns_per_model_part tok_embeddings,layers.0,layers.1,layers.2,layers.3,layers.4,layers.5,layers.6,layers.7,layers.8,layers.9,layers.10,layers.11,layers.12,layers.13,layers.14 layers.15,layers.16,layers.17,layers.18,layers.19,layers.20,layers.21,layers.22,layers.23,layers.24,layers.25,layers.26,layers.27,layers.28,layers.29,layers.30,layers.31,norm,lm_head \
  --training.disable_cuda_graphs \
  activation_checkpoint:none
