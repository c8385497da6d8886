"""Positions: how a Transformer knows where each token is, chosen by name.

Self-attention alone is permutation-equivariant; a position scheme is what tells it the order. Two
kinds plug in at two points, behind one registry (`POSITIONS`):

- at the input (`InputPositions`): vectors `(T, C)` added to the token embeddings —
  `learned` (GPT, BERT), `sinusoidal` (Vaswani et al. §3.5), `fourier` (the UIUC lecture's
  Fourier basis), `none`;
- inside attention (`AttentionPositions`, one per attention layer): `rope` rotates q and k,
  `alibi` adds a bias to the scores, `relative` (Shaw et al.) adds learned vectors to the keys
  and the values. These know only offsets i − j, so they can run past the training length.

References:
- Vaswani et al. 2017, §3.5 (sinusoidal); Radford et al. 2018/2019 (learned).
- Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with Relative Position Representations", Eq. 3–5.
- Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", §3.4.
- Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with Linear Biases" (ALiBi), §3.
- UIUC CS 447 lecture on Transformers: the Fourier basis e_t and its shift matrix R(d).
"""

import difflib
import math
from dataclasses import dataclass

import torch
from torch import nn

# ---------------------------------------------------------------------------------------------
# At the input: vectors added to the token embeddings.


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """The table of §3.5: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Returns float32 `(n_positions, d_model)`. Each pair of columns is a rotation at its own
    frequency, so PE[pos + k] is a linear function of PE[pos] and the dot product of two rows
    depends only on their offset.
    """
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(C/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (T, ceil(C/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


def fourier_positions(n_positions: int, d_model: int, period: int) -> torch.Tensor:
    """The lecture's Fourier basis: e_t = [cos(πt/T), sin(πt/T), cos(2πt/T), sin(2πt/T), …,
    cos(π(D/2)t/T), sin(π(D/2)t/T)], T = `period` — pair k (k = 1 … D/2) turns at πk/T a step.

    Returns float32 `(n_positions, d_model)` (d_model even). Its defining property: a shift in time
    is a matrix product, e_{t−d} = R(d) e_t (`fourier_shift`), so attention can learn "look d back".
    """
    if d_model % 2:
        raise ValueError(f"the Fourier basis comes in (cos, sin) pairs: d_model must be even, got {d_model}")
    t = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    k = torch.arange(1, d_model // 2 + 1, dtype=torch.float64)  # (C/2,)
    angle = math.pi * t * k / period  # (T, C/2)
    return torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1).flatten(1).float()  # (T, C): cos, sin, ...


def fourier_shift(d: int, d_model: int, period: int) -> torch.Tensor:
    """R(d) `(C, C)`: block-diagonal, one 2×2 rotation by −πkd/T per pair, so that
    `fourier_positions(...)[t - d] == R(d) @ fourier_positions(...)[t]` for every t."""
    k = torch.arange(1, d_model // 2 + 1, dtype=torch.float64)
    a = math.pi * k * d / period  # (C/2,)
    blocks = torch.stack([torch.stack([a.cos(), a.sin()], -1), torch.stack([-a.sin(), a.cos()], -1)], -2)
    # [cos(x − a), sin(x − a)] = [[cos a, sin a], [−sin a, cos a]] [cos x, sin x]
    return torch.block_diag(*blocks).float()


class InputPositions(nn.Module):
    """Vectors `(T, C)` for positions `(T,)` long, added to the token embeddings.

    `max_positions` is the longest sequence the scheme can place (None: any). Tables of fixed
    functions grow when a longer sequence comes (`grow`), so a model trained at one length can be
    evaluated at a longer one."""

    max_positions: int | None = None

    def grow(self, n_positions: int) -> None:
        """Make room for positions up to `n_positions` − 1 (called by the models before `forward`)."""


class TablePositions(InputPositions):
    """A fixed table computed by `make(n_positions)`: no parameters, extended on demand."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", self.make(n_positions), persistent=False)

    def make(self, n_positions: int) -> torch.Tensor:
        raise NotImplementedError

    def grow(self, n_positions: int) -> None:
        if n_positions > self.table.size(0):
            self.table = self.make(n_positions).to(self.table.device, self.table.dtype)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


class SinusoidalPositions(TablePositions):
    """Fixed sinusoidal encodings (no parameters), §3.5."""

    def make(self, n_positions: int) -> torch.Tensor:
        return sinusoidal_positions(n_positions, self.d_model)


class FourierPositions(TablePositions):
    """The lecture's Fourier basis (`fourier_positions`), its period T the model's training length:
    over 0 … T−1 no two positions share a vector."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        self.period = n_positions
        super().__init__(n_positions, d_model)

    def make(self, n_positions: int) -> torch.Tensor:
        return fourier_positions(n_positions, self.d_model, self.period)


class LearnedPositions(InputPositions):
    """One trained vector per absolute position (GPT, BERT); none past the table."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_positions, d_model)
        self.max_positions = n_positions

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding(positions)


class NoPositions(InputPositions):
    """No vectors at the input: a bag of tokens (the lectures' "why?"), or a model whose positions
    live inside attention."""

    def __init__(self, n_positions: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        # A buffer, so that `.to(device, dtype)` moves it like the other encodings' tables: zeros in
        # the default dtype would promote a bf16 model's activations to fp32 and break its LayerNorms.
        self.register_buffer("zero", torch.zeros(d_model), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.zero.expand(*positions.shape, self.d_model)


# ---------------------------------------------------------------------------------------------
# Inside attention: hooks that `MultiHeadAttention` calls on its self-attention.


class AttentionPositions(nn.Module):
    """Positions inside one self-attention layer. `MultiHeadAttention` calls three hooks, each a
    no-op here: `rotate` on q and k before they meet (and before k enters a KV cache), `score_bias`
    on the scores, `value_bias` on the output. Positions are absolute indices in the sequence; what
    the schemes below use of them is the offset j − i alone.

    Shapes: q `(B, H, *S, Tq, D)`; q_pos long broadcastable to `(*S, Tq, 1)`; k_pos long
    broadcastable to `(*S, Tq, Tk)`; *S are the block dimensions of a blocked attention pattern.
    """

    sdpa_allowed = True
    """Whether attention may still take PyTorch's `scaled_dot_product_attention` (a score bias goes in
    as a float mask); False where the scheme adds a term from the attention weights themselves."""

    row_positions = False
    """Whether the hooks take per-row positions `(B, 1, T)` (continuous batching): a rotation does;
    a score bias is made for one set of positions."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and the new k `(B, H, T, D)`, both at positions pos `(T,)` -> the same shapes."""
        return q, k

    def score_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """A term added to the scaled scores q·kᵀ/√D, broadcastable to `(B, H, *S, Tq, Tk)`; None: nothing."""
        return None

    def value_bias(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """A term added to the output weights @ v, `(B, H, *S, Tq, D)`, from the weights
        `(B, H, *S, Tq, Tk)` (after softmax and dropout); None: nothing."""
        return None


def rope_angles(pos: torch.Tensor, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The rotation angles p·θ_i, θ_i = theta^(−2i/D), i = 0 … D/2 − 1: float32 `(T, D/2)` for pos `(T,)`."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim)
    return pos.float().unsqueeze(-1) * inv_freq  # (T, D/2)


def rope_rotate(x: torch.Tensor, angles: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Rotate x `(..., T, D)` pairwise by angles `(T, D/2)`: pair i is (x_i, x_{i+D/2}), the
    half-split layout of GPT-NeoX and Llama (the paper's adjacent pairs, with the head's dimensions
    permuted; either way q·k depends on the positions only through their offset, RoFormer Eq. 16).
    `scale` multiplies the cosines and sines (LongRoPE's attention factor)."""
    half = x.size(-1) // 2
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # (T, D/2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


ROPE_SCALINGS = ("none", "linear", "llama3", "longrope", "yarn", "dynamic", "factors")
"""How a rotary scheme stretches its frequencies for contexts longer than it was trained on:
none; linear (position interpolation, Chen et al. 2023: every frequency divided by the factor);
llama3 (Llama 3.1's: long wavelengths divided by the factor, short ones kept, a smooth ramp between);
longrope (Ding et al. 2024, Phi-3's: each frequency divided by a searched factor of its own, one set
for sequences within the pre-training context and one past it, and the rotations scaled);
yarn (Peng et al. 2023, `yarn_frequencies`: NTK-by-parts, pairs that turn fewer than beta_slow
times over the pre-training context divided by the factor, those that turn more than beta_fast
times kept, a linear ramp between, and the rotations scaled);
dynamic (NTK-aware scaling that follows the sequence, `dynamic_ntk_frequencies`: the base grows
with the sequence's length once it passes the pre-training context);
factors (each frequency divided by a fixed factor of its own, `long_factor`, at every length: how
llama.cpp's files store Llama 3's scaling, as the tensor rope_freqs)."""
LENGTH_DEPENDENT = ("longrope", "dynamic")
"""Scalings whose frequencies depend on the length of the sequence (the longest position of a call)."""


def yarn_frequencies(
    inv_freq: torch.Tensor, theta: float, factor: float, original_context: int, beta_fast: float, beta_slow: float
) -> torch.Tensor:
    """YaRN's frequencies (Peng et al. 2023, §3.2 "NTK-by-parts", Eq. 17–18) of the unscaled
    θ_j = theta^(−2j/R), j = 0 … R/2 − 1 `(R/2,)`: pair j turns r_j = L·θ_j / 2π times over the
    pre-training context L. Pairs with r_j > beta_fast keep θ_j, those with r_j < beta_slow take
    θ_j / factor, and between them γ_j mixes the two linearly in j: θ'_j = (1 − γ_j) θ_j / factor + γ_j θ_j.
    The ramp's ends are the (fractional) pair indices where r_j = beta_fast and beta_slow, rounded
    outwards (floor, ceil), as the reference implementation and transformers do."""
    r = 2 * inv_freq.numel()

    def pair_turning(times: float) -> float:  # the j at which L·θ_j / 2π = times
        return r * math.log(original_context / (times * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), r - 1)
    high = high + 0.001 if low == high else high  # a ramp of zero width would divide by zero
    j = torch.arange(inv_freq.numel(), dtype=torch.float32, device=inv_freq.device)
    kept = 1 - ((j - low) / (high - low)).clamp(0, 1)  # γ_j: 1 for fast pairs, 0 for slow ones
    return inv_freq / factor * (1 - kept) + inv_freq * kept


def dynamic_ntk_frequencies(
    inv_freq: torch.Tensor, theta: float, factor: float, original_context: int, length: int
) -> torch.Tensor:
    """Dynamic NTK-aware scaling (bloc97 and emozilla 2023; transformers' "dynamic"): for a
    sequence of `length` > L positions (L the pre-training context) the base becomes
    theta · (factor · length / L − (factor − 1))^(R/(R−2)), so the slowest pair is stretched about
    `factor`-fold at length factor·L while the fastest stay nearly as they were; within L the
    frequencies `inv_freq` `(R/2,)` are the unscaled ones."""
    if length <= original_context:
        return inv_freq
    r = 2 * inv_freq.numel()
    base = theta * (factor * length / original_context - (factor - 1)) ** (r / (r - 2))
    return base ** (-torch.arange(0, r, 2, dtype=torch.float32, device=inv_freq.device) / r)


@dataclass(frozen=True)
class RopeScaling:
    """One rotary scheme's frequency scaling (`ROPE_SCALINGS`) and its settings."""

    kind: str = "none"
    factor: float = 1.0
    """How much longer the context is than the one trained on (linear, llama3, yarn, dynamic)."""
    original_context: int = 8192
    """llama3, longrope, yarn, dynamic: the context the model was pre-trained at."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths longer than original_context / low_freq_factor are fully scaled."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths shorter than original_context / high_freq_factor are kept."""
    short_factor: tuple[float, ...] = ()
    """longrope: each frequency's divisor while the sequence fits original_context."""
    long_factor: tuple[float, ...] = ()
    """longrope: each frequency's divisor past original_context; factors: at every length."""
    attention_factor: float = 1.0
    """longrope, yarn: the factor of the cosines and sines (the scores' temperature at long contexts)."""
    beta_fast: float = 32.0
    """yarn: pairs turning more than this many times over original_context keep their frequency."""
    beta_slow: float = 1.0
    """yarn: pairs turning fewer than this many times over original_context are divided by factor."""

    def __post_init__(self) -> None:
        check_choice("rope_scaling", self.kind, ROPE_SCALINGS)
        if self.factor <= 0 or self.original_context < 1:
            raise ValueError(f"rope_factor must be > 0 and rope_original_context >= 1, got {self}")
        if self.kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError("rope_low_freq_factor must be > 0 and below rope_high_freq_factor")
        if self.kind == "longrope" and not (self.short_factor and len(self.short_factor) == len(self.long_factor)):
            raise ValueError(
                "rope_scaling 'longrope' needs rope_short_factor and rope_long_factor, one per rotated pair"
            )
        if self.kind == "factors" and not (self.long_factor and min(self.long_factor) > 0):
            raise ValueError("rope_scaling 'factors' needs rope_long_factor, one divisor > 0 per rotated pair")
        if self.kind == "yarn" and not 0 < self.beta_slow < self.beta_fast:
            raise ValueError("rope_beta_slow must be > 0 and below rope_beta_fast")

    @property
    def one_table(self) -> bool:
        """Whether one table of angles, rotations unscaled, serves every sequence (not LongRoPE's
        or dynamic NTK's frequencies that follow the length, nor YaRN's scaled rotations)."""
        return self.kind not in LENGTH_DEPENDENT and self.attention_factor == 1.0

    def frequencies(self, inv_freq: torch.Tensor, length: int = 0, *, theta: float = 10000.0) -> torch.Tensor:
        """The scaled frequencies θ_i `(D/2,)` of the unscaled ones `inv_freq` (RoPE's base `theta`),
        for a sequence of `length` positions."""
        if self.kind == "yarn":
            c = self
            return yarn_frequencies(inv_freq, theta, c.factor, c.original_context, c.beta_fast, c.beta_slow)
        if self.kind == "dynamic":
            return dynamic_ntk_frequencies(inv_freq, theta, self.factor, self.original_context, length)
        if self.kind in ("longrope", "factors"):
            if len(self.long_factor) != inv_freq.numel():  # the short ones are as many (__post_init__)
                raise ValueError(f"rope_long_factor has {len(self.long_factor)} factors for {inv_freq.numel()} pairs")
            long = self.kind == "factors" or length > self.original_context
            factors = self.long_factor if long else self.short_factor
            return inv_freq / torch.tensor(factors, dtype=inv_freq.dtype, device=inv_freq.device)
        if self.kind == "linear":
            return inv_freq / self.factor
        if self.kind == "llama3":
            wavelength = 2 * math.pi / inv_freq
            low, high = self.original_context / self.low_freq_factor, self.original_context / self.high_freq_factor
            # Between the two wavelengths the frequency moves smoothly from scaled to kept.
            smooth = (self.original_context / wavelength - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            ramp = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
            return torch.where(wavelength > low, inv_freq / self.factor, torch.where(wavelength < high, inv_freq, ramp))
        return inv_freq


class RotaryPositions(AttentionPositions):
    """RoPE (Su et al. 2021): q and k rotated by position-dependent angles, no parameters. A key
    is rotated once, when it is made; a KV cache holds rotated keys, so a decoding step rotates
    only the new position. `scaling` stretches the frequencies (`RopeScaling`); `rotary_dims`
    rotates the first dimensions of each head alone and passes the rest (Phi's partial rotary)."""

    row_positions = True

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        *,
        theta: float = 10000.0,
        scaling: RopeScaling | None = None,
        rotary_dims: int | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.rotary_dims = rotary_dims or head_dim
        if self.rotary_dims % 2 or self.rotary_dims > head_dim:
            raise ValueError(
                f"rope rotates pairs of dimensions: the rotated size must be even and at most the head's "
                f"{head_dim}, got {self.rotary_dims}"
            )
        self.scaling = scaling or RopeScaling()

    def angles(self, pos: torch.Tensor) -> torch.Tensor:
        """The rotation angles p·θ_i, float32 `(T, R/2)` for pos `(T,)` (or `(..., T)`), R the rotated dims."""
        if self.scaling.kind == "none":
            return rope_angles(pos, self.rotary_dims, self.theta)
        r = self.rotary_dims
        inv_freq = self.theta ** (-torch.arange(0, r, 2, dtype=torch.float32, device=pos.device) / r)
        # LongRoPE picks its factors, and dynamic NTK its base, by the longest position of the call
        # (transformers does too). A decoding step's keys go into the cache rotated as that step's
        # length has it: later steps do not rotate them again, as transformers' cache does not.
        length = int(pos.max()) + 1 if self.scaling.kind in LENGTH_DEPENDENT and pos.numel() else 0
        return pos.float().unsqueeze(-1) * self.scaling.frequencies(inv_freq, length, theta=self.theta)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = self.angles(pos)  # once for both
        scale, r = self.scaling.attention_factor, self.rotary_dims
        if r == self.head_dim:
            return rope_rotate(q, angles, scale), rope_rotate(k, angles, scale)

        def first_dims(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([rope_rotate(x[..., :r], angles, scale), x[..., r:]], dim=-1)

        return first_dims(q), first_dims(k)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The head slopes m of ALiBi (Press et al. 2022, §3): for n a power of 2 the geometric
    sequence 2^(−8/n), 2^(−16/n), …, 2^(−8); otherwise the slopes of the power of 2 just below n,
    then every other slope of the next power of 2 until there are n. float32 `(n_heads,)`."""

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    below = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositions(AttentionPositions):
    """ALiBi: no position vectors, a per-head linear penalty −m·|i − j| on the scores. Under a
    causal mask j ≤ i, so this is the paper's −m·(i − j); without one (an encoder) the same
    penalty both ways."""

    def __init__(self, n_heads: int, head_dim: int, **_: object) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def score_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        distance = (k_pos - q_pos).abs()  # (*S, Tq, Tk)
        slopes = self.slopes.view(-1, *([1] * distance.dim()))  # (H, 1, ..., 1)
        return (-slopes.float() * distance).to(q.dtype)  # (H, *S, Tq, Tk)


class RelativePositions(AttentionPositions):
    """Shaw et al. 2018: learned vectors a^K_ij, a^V_ij for the offset j − i, clipped to
    [−k, k] (Eq. 5), shared by the heads (§3.3), one table per layer:
        e_ij = q_i · (k_j + a^K_ij) / √D   (Eq. 4),    z_i = Σ_j α_ij (v_j + a^V_ij)   (Eq. 3).
    The 2k+1 distinct a^K make the key term cheap: q·a^K for each offset once, `(Tq, 2k+1)`, then
    gathered by offset (Shaw §3.3's efficient form)."""

    sdpa_allowed = False  # the value term needs the weights

    def __init__(self, n_heads: int, head_dim: int, *, max_distance: int = 16, **_: object) -> None:
        super().__init__()
        self.max_distance, self.head_dim = max_distance, head_dim
        self.keys = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)  # a^K by offset + k
        self.values = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * 0.02)  # a^V

    def offsets(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """clip(j − i, −k, k) + k: long, `(*S, Tq, Tk)`."""
        k = self.max_distance
        return (k_pos - q_pos).clamp(-k, k) + k

    def score_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        by_offset = q @ self.keys.to(q.dtype).t()  # (B, H, *S, Tq, 2k+1)
        index = self.offsets(q_pos, k_pos)
        index = index.expand(*by_offset.shape[:-1], index.size(-1))  # (B, H, *S, Tq, Tk)
        return torch.gather(by_offset, -1, index) / math.sqrt(self.head_dim)

    def value_bias(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        index = self.offsets(q_pos, k_pos).expand_as(weights)  # (B, H, *S, Tq, Tk)
        by_offset = weights.new_zeros(*weights.shape[:-1], 2 * self.max_distance + 1)
        by_offset.scatter_add_(-1, index, weights)  # Σ_j α_ij over the keys at each clipped offset
        return by_offset @ self.values.to(weights.dtype)  # (B, H, *S, Tq, D)


# ---------------------------------------------------------------------------------------------
# The registry: one name per scheme, at the input or inside attention.

INPUT_POSITIONS: dict[str, type[InputPositions]] = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "fourier": FourierPositions,
    "none": NoPositions,
}
ATTENTION_POSITIONS: dict[str, type[AttentionPositions]] = {
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
    "relative": RelativePositions,
}
POSITIONS: tuple[str, ...] = (*INPUT_POSITIONS, *ATTENTION_POSITIONS)
"""Every scheme's name, for configs: `model.positions`."""


def check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError naming `field`, its choices and the close matches, when `value` is not one of
    `choices`. Example: `("positions", "rop", POSITIONS)` -> "positions must be one of 'learned',
    ..., got 'rop' (did you mean 'rope'?)"."""
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(f"{field} must be one of {', '.join(map(repr, choices))}, got {value!r}{hint}")


def check_positions(kind: str) -> None:
    """ValueError naming the choices (and close matches) when `kind` is not a scheme."""
    check_choice("positions", kind, POSITIONS)


def build_positions(kind: str, n_positions: int, d_model: int) -> InputPositions:
    """What scheme `kind` adds at the input: its vectors, or `NoPositions` for a scheme that acts
    inside attention (`build_attention_positions`)."""
    check_positions(kind)
    return INPUT_POSITIONS.get(kind, NoPositions)(n_positions, d_model)


def build_attention_positions(kind: str, n_heads: int, head_dim: int, **options: object) -> AttentionPositions | None:
    """One attention layer's share of scheme `kind` (`rope`, `alibi`, `relative`); None for the
    schemes that act at the input. Options: `theta` (rope), `max_distance` (relative)."""
    check_positions(kind)
    cls = ATTENTION_POSITIONS.get(kind)
    return None if cls is None else cls(n_heads, head_dim, **options)


def embedding_scale(d_model: int) -> float:
    """√d_model: the factor the paper multiplies token embeddings by before adding positions (§3.4)."""
    return math.sqrt(d_model)
