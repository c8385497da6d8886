"""Lightweight and dynamic convolutions (Wu et al. 2019) in place of a block's self-attention.

Each module is the paper's convolution block (Figure 2b): an input projection to 2C halved by a
GLU, the convolution, an output projection. The convolution mixes each channel over the last k
positions (a causal model: zeros padded on the left) or a window of k around the position (an
encoder), with one kernel of k taps per head, shared by the C / H channels of that head and
softmax-normalised over its taps (§3, Eq. 2–3):

    LightConv(X, W, i, c) = Σ_{j=1..k} softmax(W_{h(c)})_j · X_{i + j − ⌈(k+1)/2⌉, c}

with h(c) the head holding channel c. A lightweight convolution learns W `(H, k)`; a dynamic one
predicts it at each position from that position's input alone, W_i = reshape(W^Q X_i) `(H, k)`
(§4), so it stays linear in the sequence. In training the normalised weights are dropped out
(DropConnect, §3, "weight dropout"); at inference they are used as they are.

Decoding: a causal convolution reads the k − 1 inputs before a position and nothing else, so a
`ConvCache` keeps those alone (a shift register: zeros to begin with, which are the padding), and
each step computes the same sums as the whole forward.

Shape legend: B batch, T time, C model dim, H heads, D = C / H channels a head, K kernel taps.

References:
- Wu et al. 2019, "Pay Less Attention with Lightweight and Dynamic Convolutions", §3 (Eq. 2–3),
  §4 (dynamic), Figure 2.
- Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and
  Applications?", Table 1 (the two rows).
"""

import torch
import torch.nn.functional as F
from torch import nn

CONVOLUTIONS = ("lightweight-conv", "dynamic-conv")
"""The `model.attention` names of the convolutions: they replace self-attention in the block."""


class ConvCache:
    """The last k − 1 inputs `(B, k − 1, C)` of one causal convolution layer, for incremental
    decoding. `update(positions, x)` takes the new inputs `(B, T, C)` (consecutive positions, from
    the model's count on: `ModelCache.length`) and returns the inputs the convolution reads,
    `(B, k − 1 + T, C)`. It counts nothing, as no layer's cache does."""

    def __init__(
        self,
        batch_size: int,
        kernel: int,
        d_model: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.state = torch.zeros(batch_size, kernel - 1, d_model, device=device, dtype=dtype)

    def update(self, positions: int | torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Append x `(B, T, C)` at `positions` (an int p, or a long tensor `(T,)` of consecutive
        positions: the static path of compiled decoding); return the window `(B, k − 1 + T, C)`.
        Position 0 restarts the sequence: the register is zeros again."""
        if isinstance(positions, int):
            if positions == 0:
                self.state.zero_()
        elif positions.dim() != 1:
            raise ValueError("a ConvCache decodes rows in step: positions (T,), not one row each (B, T)")
        window = torch.cat([self.state, x.to(self.state.dtype)], dim=1)  # (B, K − 1 + T, C)
        self.state.copy_(window[:, window.size(1) - self.state.size(1) :])
        return window

    def truncate(self, length: int) -> None:
        """Not for a register: the inputs it shifted out cannot be brought back (`ModelCache.truncate`)."""
        raise ValueError("a convolution's cache cannot be truncated: it keeps its last inputs alone")

    def select_rows(self, index: torch.Tensor, filled: int = 0) -> None:
        """Keep and reorder the rows: row i becomes old row index[i] (beam search); `filled` is
        `KVCache.select_rows`' (a register moves whole)."""
        self.state = self.state.index_select(0, index)


def light_conv(x: torch.Tensor, weights: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """Eq. 3: each channel of x `(B, T, C)` convolved over time with its head's kernel, `weights`
    `(H, K)` (lightweight: one kernel for every position) or `(B, T, H, K)` (dynamic: one per
    position), already normalised. Causal: position i reads i − K + 1 … i (tap K − 1 is i itself);
    otherwise ⌊K/2⌋ before and K − 1 − ⌊K/2⌋ after. Zeros outside the sequence. Returns `(B, T, C)`."""
    k = weights.size(-1)
    left = k - 1 if causal else k // 2
    return light_conv_window(F.pad(x, (0, 0, left, k - 1 - left)), weights)


def light_conv_window(padded: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The convolution of `light_conv` over inputs already padded, `(B, T + K − 1, C)`: output t
    reads inputs t … t + K − 1 of it. Returns `(B, T, C)`."""
    b, _, c = padded.shape
    h, k = weights.shape[-2:]
    taps = padded.unfold(1, k, 1)  # (B, T, C, K)
    taps = taps.reshape(b, taps.size(1), h, c // h, k)  # (B, T, H, D, K)
    if weights.dim() == 2:
        y = torch.einsum("bthdk,hk->bthd", taps, weights.to(taps.dtype))
    else:
        y = torch.einsum("bthdk,bthk->bthd", taps, weights.to(taps.dtype))
    return y.reshape(b, -1, c)


class LightweightConv(nn.Module):
    """The lightweight convolution block (Wu et al. 2019, Figure 2b): GLU input projection, a
    convolution of K taps per head softmax-normalised and shared by the head's channels, output
    projection. Called like `MultiHeadAttention` (`(out, None)`; no attention weights to give)."""

    def __init__(self, d_model: int, n_heads: int, kernel: int, *, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if kernel < 1:
            raise ValueError(f"kernel must be >= 1, got {kernel}")
        self.d_model, self.n_heads, self.kernel, self.dropout = d_model, n_heads, kernel, dropout
        self.in_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.weight = nn.Parameter(torch.randn(n_heads, kernel) * kernel**-0.5)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, kernel={self.kernel}"

    def kernels(self, u: torch.Tensor) -> torch.Tensor:
        """The normalised kernel: `(H, K)`, the same at every position (u `(B, T, C)` unused)."""
        return self._normalise(self.weight)

    def _normalise(self, w: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(w.float(), dim=-1)
        return F.dropout(w, self.dropout) if self.training and self.dropout > 0 else w  # DropConnect

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: ConvCache | None = None,
        positions: int | torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, None]:
        """x `(B, T, C)` -> `((B, T, C), None)`. mask: key padding, bool `(B, 1, 1, T)`, True on
        real tokens (an encoder's padding is zeroed before the convolution, so it adds nothing);
        cache: the last K − 1 inputs of a causal layer, the new ones appended (`ConvCache.update`
        at `positions`: the model's count, an int, or a tensor). `need_weights` has no answer here: None."""
        u = F.glu(self.in_proj(x), dim=-1)  # (B, T, C)
        if mask is not None:
            if mask.dim() != 4 or mask.size(1) != 1 or mask.size(2) != 1:
                raise ValueError("a convolution takes a key-padding mask (B, 1, 1, T) only")
            u = u * mask[:, 0, 0, :, None].to(u.dtype)
        w = self.kernels(u)
        if cache is None:
            y = light_conv(u, w, causal=causal)
        else:
            if not causal and positions is None:
                raise ValueError("a ConvCache serves causal convolutions (a decoder) only")
            if positions is None:
                raise ValueError("a ConvCache takes the new inputs' positions: the model's count (an int) or a tensor")
            window = cache.update(positions, u)  # (B, K − 1 + T, C)
            y = light_conv_window(window, w)
        return self.out_proj(y.to(x.dtype)), None


class DynamicConv(LightweightConv):
    """The dynamic convolution (Wu et al. 2019, §4): as `LightweightConv`, but the kernel of each
    position is predicted from that position's input, W_i = W^Q u_i `(H · K)`, then softmaxed over
    the K taps."""

    def __init__(self, d_model: int, n_heads: int, kernel: int, *, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__(d_model, n_heads, kernel, dropout=dropout, bias=bias)
        del self.weight
        self.weight_proj = nn.Linear(d_model, n_heads * kernel, bias=bias)

    def kernels(self, u: torch.Tensor) -> torch.Tensor:
        """The normalised kernels `(B, T, H, K)` of the inputs u `(B, T, C)`."""
        b, t, _ = u.shape
        return self._normalise(self.weight_proj(u).view(b, t, self.n_heads, self.kernel))


def build_convolution(
    name: str, d_model: int, n_heads: int, kernel: int, *, dropout: float = 0.0, bias: bool = True
) -> LightweightConv:
    """The convolution called `name` (one of `CONVOLUTIONS`)."""
    cls = {"lightweight-conv": LightweightConv, "dynamic-conv": DynamicConv}[name]
    return cls(d_model, n_heads, kernel, dropout=dropout, bias=bias)
