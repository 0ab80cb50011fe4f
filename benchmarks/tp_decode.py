"""Tensor-parallel decoding of a Llama-shaped model on CPU ranks, cadence
against gloo, in one job and one run.

    .venv/bin/python benchmarks/tp_decode.py --nranks 2 4

The model is built here with random weights (nothing downloaded): Llama's
layout — RMSNorm, rotary attention with a KV cache, a SwiGLU MLP, tied
shapes of a small Llama (`--layers`, `--hidden`, `--heads`, `--ffn`,
`--vocab`) — in bfloat16. Each rank holds the same weights (one seed) and
torch's own tensor parallelism shards them: `parallelize_module` with
ColwiseParallel for q, k, v, gate and up, RowwiseParallel for o and down
(two allreduces of one token's hidden state per layer and token), the
embedding and the head replicated.

One job holds five copies of the model (`--models` picks some): sharded by
torch over the cadence world group (`cadence`) and over a gloo group of the
same ranks (`gloo`, through `DeviceMesh.from_group`); the same shards made
by hand (`cadence/hand`, `gloo/hand`: plain modules holding a rank's rows of
q, k, v, gate, up and columns of o and down, `dist.all_reduce` after o and
down, as vLLM, SGLang and DeepSpeed shard for CPU inference); and a *local*
one, a rank's shard with no communication at all (partial sums left
unreduced): what a step would take with infinitely fast collectives and no
DTensor. Each round prefills a prompt of `--prompt` tokens and decodes
`--tokens` more greedily with each model in turn (the order rotates); the
table gives the median prefill time and time per decoded token over the
rounds (rank 0), tokens/s, the speed against gloo sharded the same way, and
the share of a decode step beyond the local model's (1 - local/step): the
communication, and for torch's sharding also DTensor's own work per op.

Every rank computes with one thread (torch.set_num_threads(1)).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from cadence.bench import torch_job

#: torch's tensor parallelism (DTensor) on each backend, the same shards by
#: hand with dist.all_reduce (as inference engines do), and the local floor.
MODELS = ("cadence", "gloo", "cadence/hand", "gloo/hand", "local")


@dataclass
class Config:
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    max_len: int


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) \
            * self.weight


def rotary(head_dim: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(max_len).float(), inv)
    return torch.cos(ang), torch.sin(ang)


def apply_rotary(x, cos, sin):
    """x: (batch, seq, heads, head_dim); cos, sin: (seq, head_dim / 2)."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: Config, width: int) -> None:
        """`width`: the q/k/v features this copy computes (all heads, or one
        rank's share for the local model)."""
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.q = nn.Linear(cfg.hidden, width, bias=False)
        self.k = nn.Linear(cfg.hidden, width, bias=False)
        self.v = nn.Linear(cfg.hidden, width, bias=False)
        self.o = nn.Linear(width, cfg.hidden, bias=False)
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.group = None  # set: a shard whose partial output is allreduced here

    def forward(self, x, pos: int, cos, sin):
        b, s, _ = x.shape
        # Under tensor parallelism q/k/v hold this rank's heads only.
        q = self.q(x).view(b, s, -1, self.head_dim)
        k = self.k(x).view(b, s, -1, self.head_dim)
        v = self.v(x).view(b, s, -1, self.head_dim)
        q = apply_rotary(q, cos[pos:pos + s], sin[pos:pos + s])
        k = apply_rotary(k, cos[pos:pos + s], sin[pos:pos + s])
        if pos == 0 or self.cache is None:
            shape = (b, cos.shape[0], k.shape[2], self.head_dim)
            self.cache = (torch.zeros(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype))
        kc, vc = self.cache
        kc[:, pos:pos + s] = k
        vc[:, pos:pos + s] = v
        keys, values = kc[:, :pos + s].transpose(1, 2), vc[:, :pos + s].transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=s > 1)
        return _reduced(self.o(out.transpose(1, 2).reshape(b, s, -1)), self.group)


def _reduced(x, group):
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(x, group=group)
    return x


class MLP(nn.Module):
    def __init__(self, cfg: Config, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.hidden, width, bias=False)
        self.up = nn.Linear(cfg.hidden, width, bias=False)
        self.down = nn.Linear(width, cfg.hidden, bias=False)
        self.group = None

    def forward(self, x):
        return _reduced(self.down(F.silu(self.gate(x)) * self.up(x)), self.group)


class Block(nn.Module):
    def __init__(self, cfg: Config, share: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden)
        self.attn = Attention(cfg, cfg.hidden // share)
        self.norm2 = RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg, cfg.ffn // share)

    def forward(self, x, pos, cos, sin):
        x = x + self.attn(self.norm1(x), pos, cos, sin)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """A Llama-shaped decoder; `share` > 1 makes one rank's shard of it
    (the local model)."""

    def __init__(self, cfg: Config, share: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, share) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        cos, sin = rotary(cfg.hidden // cfg.heads, cfg.max_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids, pos: int):
        x = self.embed(ids)
        for blk in self.blocks:
            x = blk(x, pos, self.cos, self.sin)
        return self.head(self.norm(x[:, -1:]))


def parallelize(model: Decoder, mesh) -> Decoder:
    """torch's own tensor parallelism over `mesh`: q, k, v, gate, up
    column-wise, o and down row-wise (their outputs allreduced)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel()}
    for blk in model.blocks:
        parallelize_module(blk, mesh, plan)
    return model


@torch.no_grad()
def shard(full: Decoder, cfg: Config, rank: int, n: int, group) -> Decoder:
    """Rank `rank`'s shard of `full` by hand, as inference engines shard:
    its rows of q, k, v, gate and up, its columns of o and down, the rest
    copied; o's and down's partial sums allreduced over `group` (None: left
    as they are, the local model)."""
    part = Decoder(cfg, share=n).to(torch.bfloat16)
    for name, p in part.named_parameters():
        w = full.get_parameter(name)
        leaf = name.rsplit(".", 2)[-2]
        if leaf in ("q", "k", "v", "gate", "up"):
            w = w.chunk(n, dim=0)[rank]
        elif leaf in ("o", "down"):
            w = w.chunk(n, dim=1)[rank]
        p.copy_(w)
    for blk in part.blocks:
        blk.attn.group = blk.mlp.group = group
    return part


@torch.no_grad()
def generate(model: Decoder, prompt: torch.Tensor, tokens: int) -> tuple[float, float, list]:
    """(prefill seconds, seconds per decoded token, the tokens)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    logits = model(prompt, 0)
    t1 = time.perf_counter()
    out = []
    pos = prompt.shape[1]
    for _ in range(tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(int(nxt))
        logits = model(nxt, pos)
        pos += 1
    t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / tokens, out


def _rank_main(rank, n, port, args, outdir):
    torch.set_num_threads(1)
    import cadence  # noqa: F401 - registers the backend
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("cadence", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    gloo = dist.new_group(backend="gloo")
    cfg = Config(args.layers, args.hidden, args.heads, args.ffn, args.vocab,
                 args.prompt + args.tokens + 1)
    groups = {"cadence": dist.group.WORLD, "gloo": gloo}
    models = {}
    for name in args.models:
        torch.manual_seed(0)  # every rank the same weights
        full = Decoder(cfg).to(torch.bfloat16)
        backend, _, how = name.partition("/")
        if name == "local":
            models[name] = shard(full, cfg, rank, n, None)
        elif how == "hand":
            models[name] = shard(full, cfg, rank, n, groups[backend])
        else:
            models[name] = parallelize(full, DeviceMesh.from_group(groups[backend], "cpu"))
    prompt = torch.randint(0, cfg.vocab, (1, args.prompt),
                           generator=torch.Generator().manual_seed(1))
    for m in models.values():
        generate(m, prompt, 2)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
    texts = {}
    order = list(args.models)
    for rnd in range(args.rounds):
        k = rnd % len(order)
        for name in order[k:] + order[:k]:
            prefill, per_token, toks = generate(models[name], prompt, args.tokens)
            times[name].append((prefill, per_token))
            texts[name] = toks
    torch_job.report(outdir, rank, {"times": times, "texts": texts})
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=2816, help="the MLP's inner width")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (prefill)")
    p.add_argument("--tokens", type=int, default=32, help="tokens decoded per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"which, a comma list ({','.join(MODELS)})")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        p.error(f"unknown model {bad[0]!r} (one of {', '.join(MODELS)})")
    cfg = Config(args.layers, args.hidden, args.heads, args.ffn, args.vocab, 1)
    nparams = sum(x.numel() for x in Decoder(cfg).parameters())
    print(f"# Llama-shaped decoder, {args.layers} layers, hidden {args.hidden}, {args.heads} "
          f"heads, FFN {args.ffn}, vocab {args.vocab}: {nparams / 1e6:.0f}M parameters, "
          f"bfloat16; prompt {args.prompt}, {args.tokens} tokens decoded, {args.rounds} rounds; "
          f"torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    print(f"{'ranks':>5} {'model':>13} {'prefill':>9} {'per token':>10} {'tokens/s':>9} "
          f"{'vs gloo':>8} {'comm share':>10}", flush=True)
    for n in args.nranks:
        ranks = torch_job.run(_rank_main, n, args, args.timeout)
        texts = ranks[0]["texts"]
        # Every rank decodes the same tokens (the local model aside: each
        # rank's holds other weights).
        tp = [m for m in args.models if m != "local"]
        if any(r["texts"][m] != texts[m] for r in ranks for m in tp):
            print(f"# {n} ranks: the ranks decoded different tokens", flush=True)
        for a, b in (("cadence", "gloo"), ("cadence/hand", "gloo/hand")):
            if a in texts and b in texts and texts[a] != texts[b]:
                print(f"# {n} ranks: {a} and {b} decoded different tokens (bfloat16 sums "
                      f"in another order): {texts[a]} / {texts[b]}", flush=True)
        med = {m: (statistics.median(t[0] for t in ranks[0]["times"][m]),
                   statistics.median(t[1] for t in ranks[0]["times"][m])) for m in args.models}
        for m in args.models:
            prefill, tok = med[m]
            local = med.get("local")
            share = "" if m == "local" or not local else f"{1 - local[1] / tok:>9.0%}"
            _, _, how = m.partition("/")
            gloo = med.get("gloo" + ("/" + how if how else ""))
            vs = "" if m == "local" or not gloo else f"{gloo[1] / tok:>7.2f}x"
            print(f"{n:>5} {m:>13} {prefill * 1e3:>7.1f}ms {tok * 1e3:>8.2f}ms "
                  f"{1 / tok:>9.1f} {vs:>8} {share:>10}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
