"""
Written like karpathy/nanoGPT's train.py, which knows nothing of runyard: module-level settings
overridden by ``exec(open('configurator.py').read())`` (so it must run in its own folder), data
read from ``data/<dataset>/`` by a relative path, ``iter N: loss X, time Tms, mfu M%`` printed by
the master process, ``out/ckpt.pt`` written at every evaluation (in place, as nanoGPT does) and
read back with ``--init_from=resume``. Changed from nanoGPT to stay tiny on a CPU (a bigram model
instead of the GPT) and, for runyard's tests, to fail on purpose with ``FAULT_RAISE_AT=ITER:RANK``.

    torchrun --standalone --nproc_per_node=2 train.py config/train_tiny_char.py
"""

import os
import time

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values
out_dir = 'out'
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False
always_save_checkpoint = True
init_from = 'scratch'  # 'scratch' or 'resume'
dataset = 'openwebtext'
batch_size = 12
block_size = 1024
learning_rate = 6e-4
max_iters = 600000
backend = 'gloo'
iter_sleep = 0.01
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
exec(open('configurator.py').read())  # overrides from command line or config file
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    ddp_rank = 0
    master_process = True
    seed_offset = 0
if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)

data_dir = os.path.join('data', dataset)
text = open(os.path.join(data_dir, 'input.txt')).read()
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    d = train_data if split == 'train' else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    x = torch.stack([d[i:i + block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets):
        logits = self.table(idx)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


iter_num = 0
best_val_loss = 1e9
model = Bigram(len(chars))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if init_from == 'resume':
    print(f"Resuming training from {out_dir}")
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = torch.load(ckpt_path, map_location='cpu', weights_only=True)
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    iter_num = checkpoint['iter_num']
    best_val_loss = checkpoint['best_val_loss']
    checkpoint = None
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model

raise_at = os.environ.get('FAULT_RAISE_AT')
raise_at = tuple(int(x) for x in raise_at.split(':')) if raise_at else None


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch('train')
t0 = time.time()
while True:
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        if losses['val'] < best_val_loss or always_save_checkpoint:
            best_val_loss = min(best_val_loss, float(losses['val']))
            if iter_num > 0:
                checkpoint = {
                    'model': raw_model.state_dict(),
                    'optimizer': optimizer.state_dict(),
                    'iter_num': iter_num,
                    'best_val_loss': best_val_loss,
                    'config': config,
                }
                print(f"saving checkpoint to {out_dir}", flush=True)
                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))
    if iter_num == 0 and eval_only:
        break
    if raise_at == (iter_num, ddp_rank):
        raise RuntimeError(f"loss went NaN at iter {iter_num}")
    _, loss = model(X, Y)
    X, Y = get_batch('train')
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    time.sleep(iter_sleep)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        lossf = loss.item()
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {-100.00:.2f}%", flush=True)
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
