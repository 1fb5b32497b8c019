# meshplan plan: dp16 zero2x16 tp1 pp1 cp1 mb2 ckpt=full:all on 16 GPUs (2 nodes x 8)
# torchtitan 0.3.0: --module/--config name a config_registry function; the options below override it
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train \
  --module llama3 --config llama3_8b \
  --training.seq_len 4096 \
  --training.global_batch_size 64 \
  --training.local_batch_size 2 \
  --training.mixed_precision_param bfloat16 \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 16 \
  --parallelism.fsdp_reshard_after_forward never \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 1 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 1 \
  activation_checkpoint:full
