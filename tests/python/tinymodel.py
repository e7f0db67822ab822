"""A tiny decoder-only transformer in NumPy, for numerical proofs.

Llama-shaped: RMSNorm, grouped-query attention with rotary embeddings
(the K and V real engines cache), a SwiGLU MLP, fp32, random weights from
a seed. Small (4 layers, 8 query heads over 2 KV heads, head_dim 16) so a
prompt of a few hundred tokens runs in well under a second.

BIT-EXACT BY CONSTRUCTION. Every token's row is computed alone (vector x
matrix, attention of one query over its keys), so the arithmetic of row i
depends only on rows 0..i — never on how many tokens are in the batch.
Hence a prefill that takes rows 0..c-1 of K and V from a cache and
computes rows c..n-1 produces *bitwise* the same logits as a full
recompute, provided the cached K and V are bitwise what the full
recompute would have computed. Any corruption of a restored page shows.

The KV cache is paged like an engine's: per layer, K and V as arrays
[nblocks, P, H, D] reached through a block table (PagedKV). Views over
memory registered with the daemon (vLLM layout, or any strided layout)
make the model read and write that memory directly.
"""
from __future__ import annotations

import json
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 256,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


class PagedKV:
    """Per layer, K and V as [nblocks, P, H, D] float32 arrays (views)."""

    def __init__(self, ks: List[np.ndarray], vs: List[np.ndarray]) -> None:
        self._k, self._v = ks, vs
        self.nblocks, self.page_tokens = ks[0].shape[0], ks[0].shape[1]
        # recurrent (mamba-like) layers: per layer [nblocks, S] views,
        # block b's state the h at the boundary the block holds
        self.states: dict = {}

    def k(self, layer: int) -> np.ndarray:
        return self._k[layer]

    def v(self, layer: int) -> np.ndarray:
        return self._v[layer]

    @classmethod
    def from_strided(cls, buf, layer_offsets: Sequence[int], nblocks: int,
                     block_stride: int, kv_stride: int, token_stride: int,
                     page_tokens: int, kv_heads: int,
                     head_dim: int) -> "PagedKV":
        """Views over @buf (anything with the buffer protocol): layer l's
        block b, kv k, token t at layer_offsets[l] + b*block_stride +
        k*kv_stride + t*token_stride; heads then dims contiguous."""
        ks, vs = [], []
        for off in layer_offsets:
            a = np.ndarray((2, nblocks, page_tokens, kv_heads, head_dim),
                           dtype=np.float32, buffer=buf, offset=int(off),
                           strides=(kv_stride, block_stride, token_stride,
                                    head_dim * 4, 4))
            ks.append(a[0])
            vs.append(a[1])
        return cls(ks, vs)

    @classmethod
    def from_memory(cls, mem, geometry) -> "PagedKV":
        """Views over kvtier.Memory from Client.alloc() / alloc_memfd()."""
        if geometry.dtype_bytes != 4:
            raise ValueError("tinymodel is fp32: the geometry's dtype must be "
                             "4 bytes")
        offs = [mem.layer_offset(l) for l in range(geometry.layers)]
        return cls.from_strided(mem.buffer, offs, mem.nblocks,
                                mem.block_stride, mem.kv_stride,
                                mem.token_stride, geometry.page_tokens,
                                geometry.kv_heads, geometry.head_dim)

    @classmethod
    def private(cls, nblocks: int, layers: int, page_tokens: int,
                kv_heads: int, head_dim: int) -> "PagedKV":
        shape = (nblocks, page_tokens, kv_heads, head_dim)
        return cls([np.zeros(shape, np.float32) for _ in range(layers)],
                   [np.zeros(shape, np.float32) for _ in range(layers)])


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.float32(np.dot(x, x) / np.float32(x.shape[0]))
    return (x / np.sqrt(var + np.float32(eps))) * w


class TinyModel:
    """The model. prefill() is what an engine's forward pass does for one
    request: read cached K/V, compute the rest, write it to the cache."""

    def __init__(self, seed: int = 0, config: Optional[dict] = None) -> None:
        c = dict(CONFIG if config is None else config)
        self.config = c
        self.layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.qh = c["num_attention_heads"]
        self.kvh = c["num_key_value_heads"]
        self.d = c.get("head_dim", self.hidden // self.qh)
        self._init_weights(c, seed, lambda w, h: dict(
            wq=w(h, self.qh * self.d), wk=w(h, self.kvh * self.d),
            wv=w(h, self.kvh * self.d), wo=w(self.qh * self.d, h)))
        inv = 1.0 / (c["rope_theta"] ** (np.arange(0, self.d, 2) / self.d))
        self._inv_freq = inv  # float64; each position's angles cast once
        # sliding-window layers (Hugging Face's layer_types, as Gemma's
        # and Qwen's configs give them): a query at t attends to the
        # sliding_window tokens t - W + 1 .. t; 0: full attention
        types = c.get("layer_types") or ["full_attention"] * self.layers
        self.windows = [int(c["sliding_window"]) if t == "sliding_attention"
                        else 0 for t in types]
        # recurrent layers (layer_types "mamba"): a linear recurrence
        # h_t = a * h_{t-1} + B x_t per layer in place of attention, its
        # output C h_t; weights from a second stream of the seed, so the
        # other layers' weights are those of CONFIG
        self.recurrent = [t == "mamba" for t in types]
        self.state = int(c.get("state_size", 0))
        if any(self.recurrent):
            rng = np.random.default_rng(seed + 7919)
            for l, lw in enumerate(self.lw):
                if self.recurrent[l]:
                    lw["ra"] = rng.uniform(0.5, 0.99, self.state).astype(
                        np.float32)
                    lw["rb"] = (rng.standard_normal((self.hidden,
                                                     self.state)) /
                                np.sqrt(self.hidden)).astype(np.float32)
                    lw["rc"] = (rng.standard_normal((self.state,
                                                     self.hidden)) /
                                np.sqrt(self.state)).astype(np.float32)

    def _init_weights(self, c: dict, seed: int,
                      attn: Callable[..., dict]) -> None:
        """Random weights from @seed: embedding, per layer the norms, the
        attention weights @attn(w, hidden) makes and the MLP, the head."""
        self.vocab = c["vocab_size"]
        self.eps = c["rms_norm_eps"]
        rng = np.random.default_rng(seed)

        def w(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) /
                    np.sqrt(shape[0])).astype(np.float32)

        h, inter = self.hidden, c["intermediate_size"]
        self.embed = rng.standard_normal((self.vocab, h)).astype(np.float32)
        self.lw = []
        for _ in range(self.layers):
            lw = dict(ln1=(1 + 0.1 * rng.standard_normal(h)).astype(
                np.float32))
            lw.update(attn(w, h))
            lw.update(ln2=(1 + 0.1 * rng.standard_normal(h)).astype(
                np.float32), wg=w(h, inter), wu=w(h, inter), wd=w(inter, h))
            self.lw.append(lw)
        self.norm = np.ones(h, np.float32)
        self.head = w(h, self.vocab)

    def _ffn(self, x: np.ndarray, att: np.ndarray, lw: dict) -> np.ndarray:
        """The residual around attention output @att, then SwiGLU."""
        h1 = x + att
        hn = _rms(h1, lw["ln2"], self.eps)
        gt = hn @ lw["wg"]
        act = gt / (np.float32(1) + np.exp(-gt)) * (hn @ lw["wu"])
        return h1 + act @ lw["wd"]

    def _logits(self, x: np.ndarray) -> np.ndarray:
        return np.stack([_rms(x[r], self.norm, self.eps) @ self.head
                         for r in range(x.shape[0])])

    def config_json(self) -> str:
        return json.dumps(self.config, indent=1)

    def _rope(self, x: np.ndarray, pos: int) -> np.ndarray:
        """Rotary embedding of one row [heads, D] at @pos (rotate-half)."""
        ang = pos * self._inv_freq
        cos = np.cos(ang).astype(np.float32)
        sin = np.sin(ang).astype(np.float32)
        half = self.d // 2
        x1, x2 = x[:, :half], x[:, half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                              axis=1)

    def prefill(self, tokens: Sequence[int], kv: PagedKV,
                block_table: Any, num_cached: int,
                before_layer: Optional[Callable[[int], None]] = None,
                after_layer: Optional[Callable[[int], None]] = None
                ) -> np.ndarray:
        """Logits [len(tokens) - num_cached, vocab] of positions
        num_cached.. of @tokens. K/V of positions < num_cached are read
        from @kv (page t // P is block block_table[t // P]); the rest are
        computed and written there. before_layer(l) runs before layer l
        reads the cache (a connector's wait-for-layer-load), after_layer(l)
        after it wrote its K/V (save-layer). @block_table may be a
        function of the layer (a hybrid model's groups each have one);
        a sliding-window layer reads only the window's rows, so pages
        wholly before it may be any block (an engine's null block)."""
        n, p = len(tokens), kv.page_tokens
        table = block_table if callable(block_table) else \
            (lambda _l: block_table)
        if not 0 <= num_cached < n:
            raise ValueError("prefill: need at least one token to compute")
        if len(table(0)) * p < n:
            raise ValueError("prefill: block table too short")
        x = np.stack([self.embed[t] for t in tokens[num_cached:]])
        scale = np.float32(1.0 / np.sqrt(self.d))
        group = self.qh // self.kvh
        for l, lw in enumerate(self.lw):
            if before_layer:
                before_layer(l)
            if self.recurrent[l]:
                x = self._recur(x, lw, kv.states[l], table(l), num_cached,
                                n, p)
                if after_layer:
                    after_layer(l)
                continue
            kc, vc = kv.k(l), kv.v(l)
            block_table = table(l)
            win = self.windows[l]
            qs = []
            for r in range(x.shape[0]):
                pos = num_cached + r
                hn = _rms(x[r], lw["ln1"], self.eps)
                q = self._rope((hn @ lw["wq"]).reshape(self.qh, self.d), pos)
                k = self._rope((hn @ lw["wk"]).reshape(self.kvh, self.d), pos)
                v = (hn @ lw["wv"]).reshape(self.kvh, self.d)
                b, t = block_table[pos // p], pos % p
                kc[b, t] = k
                vc[b, t] = v
                qs.append(q)
            if after_layer:
                after_layer(l)
            out = np.empty_like(x)
            for r in range(x.shape[0]):
                pos = num_cached + r
                npg = pos // p + 1
                blocks = list(block_table[:npg])
                lo = max(0, pos - win + 1) if win else 0
                keys = kc[blocks].reshape(npg * p, self.kvh,
                                          self.d)[lo:pos + 1]
                vals = vc[blocks].reshape(npg * p, self.kvh,
                                          self.d)[lo:pos + 1]
                heads = []
                for hq in range(self.qh):
                    g = hq // group
                    s = (keys[:, g, :] @ qs[r][hq]) * scale
                    e = np.exp(s - s.max())
                    heads.append((e / e.sum()) @ vals[:, g, :])
                out[r] = self._ffn(x[r], np.concatenate(heads) @ lw["wo"],
                                   lw)
            x = out
        return self._logits(x)

    def _recur(self, x: np.ndarray, lw: dict, st: np.ndarray, table: Any,
               c: int, n: int, p: int) -> np.ndarray:
        """A recurrent layer over rows c..n-1: the state at token c from
        the block of the table's entry ceil(c / P) - 1 (zero at c = 0),
        the state at n written to entry ceil(n / P) - 1 (vLLM's mamba
        "align" mode: a state kept per block, read from the last one
        computed)."""
        h = (st[table[-(-c // p) - 1], :self.state].copy() if c
             else np.zeros(self.state, np.float32))
        out = np.empty_like(x)
        for r in range(x.shape[0]):
            hn = _rms(x[r], lw["ln1"], self.eps)
            h = lw["ra"] * h + hn @ lw["rb"]
            out[r] = self._ffn(x[r], h @ lw["rc"], lw)
        st[table[-(-n // p) - 1], :self.state] = h
        return out

    def greedy(self, tokens: Sequence[int], n: int) -> List[int]:
        """The @n tokens greedy decoding after @tokens gives, each
        recomputed from nothing: the reference of a decode."""
        out, seq = [], list(tokens)
        for _ in range(n):
            out.append(int(np.argmax(self.logits(seq)[-1])))
            seq.append(out[-1])
        return out

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Every position's logits, recomputed from nothing in a private
        cache: the reference."""
        p = 4
        nb = (len(tokens) + p - 1) // p
        kv = PagedKV.private(nb, self.layers, p, self.kvh, self.d)
        kv.states = {l: np.zeros((nb, self.state), np.float32)
                     for l, r in enumerate(getattr(self, "recurrent", ()))
                     if r}
        return self.prefill(tokens, kv, list(range(nb)), 0)


# a hybrid model: sliding-window layers beside full attention, as Gemma's
# and Qwen's configs name them (vLLM's hybrid allocator groups layers 0, 2
# and 1, 3)
SWA_CONFIG = dict(CONFIG, sliding_window=9,
                  layer_types=["sliding_attention", "full_attention"] * 2)

# a hybrid model: recurrent (mamba-like) layers beside full attention, as
# vLLM's allocator groups them (layers 0, 2 a mamba group, 1, 3 full
# attention); a state of 32 floats fits a page of one layer (2 * P * 2 *
# 16 floats), the rest of the page vLLM's padding
MAMBA_CONFIG = dict(CONFIG, state_size=32,
                    layer_types=["mamba", "full_attention"] * 2)

MLA_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "num_hidden_layers": 3,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


class TinyMLAModel(TinyModel):
    """The same decoder with multi-head latent attention (DeepSeek-V2's
    MLA): each token caches ONE latent per layer, [c_kv (kv_lora_rank) |
    k_rope (qk_rope_head_dim)] — what vLLM's MLA backends and SGLang's MLA
    pools hold — and every head's K and V are expanded from it when
    attending (K_h = [c_kv W_uk_h, rope(k_rope)], V_h = c_kv W_uv_h). The
    cache is PagedKV's K arrays of shape [nblocks, P, 1, latent]; V is
    unused. Bit-exact by construction as TinyModel: each row alone."""

    def __init__(self, seed: int = 0, config: Optional[dict] = None) -> None:
        c = dict(MLA_CONFIG if config is None else config)
        self.config = c
        self.layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.qh = c["num_attention_heads"]
        self.r = c["kv_lora_rank"]
        self.dr = c["qk_rope_head_dim"]
        self.dn = c["qk_nope_head_dim"]
        self.dv = c["v_head_dim"]
        self.kvh, self.d = 1, self.r + self.dr   # the cache: one latent
        self._init_weights(c, seed, lambda w, h: dict(
            wq=w(h, self.qh * (self.dn + self.dr)), wkv=w(h, self.r + self.dr),
            wuk=w(self.r, self.qh * self.dn), wuv=w(self.r, self.qh * self.dv),
            wo=w(self.qh * self.dv, h)))
        self._inv_freq = 1.0 / (c["rope_theta"] **
                                (np.arange(0, self.dr, 2) / self.dr))

    def _rope_r(self, x: np.ndarray, pos: int) -> np.ndarray:
        ang = pos * self._inv_freq
        cos = np.cos(ang).astype(np.float32)
        sin = np.sin(ang).astype(np.float32)
        half = self.dr // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                              axis=-1)

    def prefill(self, tokens: Sequence[int], kv: PagedKV,
                block_table: Sequence[int], num_cached: int,
                before_layer: Optional[Callable[[int], None]] = None,
                after_layer: Optional[Callable[[int], None]] = None
                ) -> np.ndarray:
        n, p = len(tokens), kv.page_tokens
        if not 0 <= num_cached < n:
            raise ValueError("prefill: need at least one token to compute")
        if len(block_table) * p < n:
            raise ValueError("prefill: block table too short")
        x = np.stack([self.embed[t] for t in tokens[num_cached:]])
        scale = np.float32(1.0 / np.sqrt(self.dn + self.dr))
        for l, lw in enumerate(self.lw):
            if before_layer:
                before_layer(l)
            lat = kv.k(l)                      # [nblocks, P, 1, r + dr]
            qs = []
            for r in range(x.shape[0]):
                pos = num_cached + r
                hn = _rms(x[r], lw["ln1"], self.eps)
                q = (hn @ lw["wq"]).reshape(self.qh, self.dn + self.dr)
                q = np.concatenate([q[:, :self.dn],
                                    self._rope_r(q[:, self.dn:], pos)],
                                   axis=1)
                c = hn @ lw["wkv"]
                c = np.concatenate([c[:self.r],
                                    self._rope_r(c[self.r:], pos)])
                b, t = block_table[pos // p], pos % p
                lat[b, t, 0] = c
                qs.append(q)
            if after_layer:
                after_layer(l)
            out = np.empty_like(x)
            for r in range(x.shape[0]):
                pos = num_cached + r
                npg = pos // p + 1
                blocks = list(block_table[:npg])
                cs = lat[blocks].reshape(npg * p, self.d)[:pos + 1]
                ckv, krope = cs[:, :self.r], cs[:, self.r:]
                kn = (ckv @ lw["wuk"]).reshape(-1, self.qh, self.dn)
                vv = (ckv @ lw["wuv"]).reshape(-1, self.qh, self.dv)
                heads = []
                for hq in range(self.qh):
                    s = (kn[:, hq, :] @ qs[r][hq, :self.dn] +
                         krope @ qs[r][hq, self.dn:]) * scale
                    e = np.exp(s - s.max())
                    heads.append((e / e.sum()) @ vv[:, hq, :])
                out[r] = self._ffn(x[r], np.concatenate(heads) @ lw["wo"],
                                   lw)
            x = out
        return self._logits(x)
