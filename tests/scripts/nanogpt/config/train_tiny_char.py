# a tiny character-level model that trains in seconds on a CPU (after nanoGPT's config/train_shakespeare_char.py)
out_dir = 'out'
eval_interval = 20
eval_iters = 5
log_interval = 1
always_save_checkpoint = True
dataset = 'tiny_char'
batch_size = 16
block_size = 16
max_iters = 100
learning_rate = 1e-2
