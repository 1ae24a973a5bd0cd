"""``reasonrl fuse``: SURGE fusion of two checkpoints of one RL run into a standard HF folder.

Loads base, anchor and donor (any of: ``tiny``, an alias such as ``smollm2-135m``, a run
folder (its ``final_model``), a checkpoint folder ``runs/X/checkpoints/step_NNNNNN`` (its
``model/``), a model folder, a ``.gguf`` file), checks that they share an architecture and
every parameter's shape, fuses every 2-D weight with ``algos.surge.fuse_matrix``, copies the
1-D parameters (norms, biases) from the anchor, and writes the anchor's architecture with the
fused weights, its tokenizer and a ``fuse.json`` (settings, per-matrix ranks and retained
energy) to a temporary folder renamed into place, so a failed fusion leaves nothing behind.
The method and its INFERRED status: ``docs/methods/surge.md``.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import torch

from reasonrl.methods.surge.maths import Control, Projection, fuse_matrix
from reasonrl.params import ConfigError
from reasonrl.fsutil import atomic_directory
from reasonrl.params import Range, check_component_params
from reasonrl.policy.loading import HUB_ID, SMOLLM2_ALIAS, model_folder

FUSE_FILE = "fuse.json"


@dataclass(frozen=True)
class FuseSettings:
    retain: Annotated[float, Range(ge=0, le=1)] = 0.9
    """ρ: the fraction of the anchor update's spectral energy kept in P_a (sets k per matrix)."""
    gamma: Annotated[float, Range(ge=0)] = 1.0
    """γ: the weight of the donor's complementary component C_d (the spec: γ ∈ [0, 1])."""
    beta_res: Annotated[float, Range(ge=0)] = 0.0
    """β_res: the weight of the anchor's residual Δ_a − P_a (0: dropped; 1 with γ = 0: W_a)."""
    projection: Projection = "two_sided"
    """C_d = (I − U_kU_kᵀ)Δ_d(I − V_kV_kᵀ) (``two_sided``) or (I − U_kU_kᵀ)Δ_d (``one_sided``)."""
    embeddings: Literal["svd", "anchor"] = "svd"
    """``svd``: the (tied) embedding / LM-head matrices are fused like any weight;
    ``anchor``: copied from the anchor."""
    control: Control = "none"
    """``random``: a Gaussian direction in C_d's complement with ‖C_d‖_F instead of C_d;
    ``random_unconstrained``: the same without the projection (geometric controls)."""
    seed: Annotated[int, Range(ge=0)] = 0
    """Seeds the control's random directions (per matrix: seed and the parameter's name)."""

    @classmethod
    def validated(cls, **raw: Any) -> "FuseSettings":
        """Settings checked against the declared types and bounds; a ConfigError names the key."""
        return cls(**check_component_params(cls, raw, "reasonrl fuse", "fuse", ()))


def resolve_source(spec: str, role: str) -> str:
    """What to load for ``spec``: aliases and hub ids as they are; a run folder's
    ``final_model``; a checkpoint folder's ``model/``; a model folder. Clear errors otherwise."""
    if spec in ("tiny", SMOLLM2_ALIAS):
        return spec
    path = Path(spec)
    if not path.exists():
        if HUB_ID.match(spec) and not spec.startswith("."):
            return spec  # a hub id: the loader says clearly if it cannot be fetched
        raise FileNotFoundError(f"{role} {spec}: no such folder ({path.expanduser().resolve()})")
    if path.is_file():
        if path.suffix == ".gguf":
            return spec
        raise ConfigError(f"{role} {spec}: a file; expected a model folder, a run or checkpoint folder, or a .gguf")
    resolved = model_folder(path)
    if resolved != path:
        path = resolved
    elif (path / "checkpoints").is_dir() and not (path / "config.json").is_file():
        steps = sorted(p.name for p in (path / "checkpoints").iterdir() if p.name.startswith("step_"))
        raise ConfigError(f"{role} {spec}: a run folder without final_model (unfinished?); name a checkpoint "
                          f"instead: {', '.join(str(path / 'checkpoints' / s) for s in steps) or 'none saved'}")
    if (path / "adapter_config.json").is_file():
        raise ConfigError(f"{role} {spec}: a LoRA adapter folder; fuse full weights (train with "
                          "model.save_merged: true and pass final_model/merged)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{role} {spec}: not a model folder (no config.json in {path})")
    return str(path)


def load_source(spec: str, role: str, log: Callable[[str], None]):
    from reasonrl.policy.factory import load_for_eval

    resolved = resolve_source(spec, role)
    log(f"loading {role}: {spec}" + (f" ({resolved})" if resolved != spec else ""))
    return resolved, load_for_eval(resolved, log=log)


def check_compatible(models: dict[str, torch.nn.Module]) -> None:
    """The same model type and the same parameter names and shapes; the error names the
    first parameter that differs and the two models."""
    (ref_role, ref), *others = models.items()
    ref_params = {n: tuple(p.shape) for n, p in ref.named_parameters()}
    for role, model in others:
        if model.config.model_type != ref.config.model_type:
            raise ConfigError(f"{role} is a {model.config.model_type} model but {ref_role} is a "
                              f"{ref.config.model_type}; fuse checkpoints of one architecture")
        params = {n: tuple(p.shape) for n, p in model.named_parameters()}
        for name in [*ref_params, *(n for n in params if n not in ref_params)]:  # model order: a stable 'first'
            if name not in params or name not in ref_params:
                has, lacks = (ref_role, role) if name not in params else (role, ref_role)
                raise ConfigError(f"parameter '{name}' exists in {has} but not in {lacks}: not the same architecture")
            if params[name] != ref_params[name]:
                raise ConfigError(f"parameter '{name}' has shape {ref_params[name]} in {ref_role} but "
                                  f"{params[name]} in {role}: not the same architecture")


def embedding_names(model: torch.nn.Module) -> set[str]:
    """Names of the input embedding and LM-head weights (one name when they are tied)."""
    targets = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings())
               if m is not None and getattr(m, "weight", None) is not None}
    return {n for n, p in model.named_parameters() if id(p) in targets}


def matrix_seed(seed: int, name: str) -> int:
    # Per-parameter seeds (not one stream in iteration order) keep a control's direction for a
    # matrix the same whatever other parameters the model has.
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63)


@torch.no_grad()
def fuse_models(base: torch.nn.Module, anchor: torch.nn.Module, donor: torch.nn.Module, settings: FuseSettings,
                log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Overwrite ``anchor``'s weights with the fused ones (in place); returns the report.

    2-D (and higher, flattened to d₀ × rest) weights are fused; 1-D parameters and, with
    ``embeddings: anchor``, the embedding / LM-head weights keep the anchor's values."""
    check_compatible({"base": base, "anchor": anchor, "donor": donor})
    base_p, donor_p = dict(base.named_parameters()), dict(donor.named_parameters())
    skip = embedding_names(anchor) if settings.embeddings == "anchor" else set()
    named = list(anchor.named_parameters())
    todo = [(n, p) for n, p in named if p.dim() >= 2 and n not in skip]
    copied = [n for n, p in named if p.dim() < 2 or n in skip]
    matrices = []
    start = last = time.monotonic()
    for i, (name, param) in enumerate(todo):
        shape = param.shape

        def flat(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(shape[0], -1)

        generator = None
        if settings.control != "none":
            generator = torch.Generator().manual_seed(matrix_seed(settings.seed, name))
        out = fuse_matrix(flat(base_p[name]), flat(param), flat(donor_p[name]), retain=settings.retain,
                          gamma=settings.gamma, beta_res=settings.beta_res, projection=settings.projection,
                          control=settings.control, generator=generator)
        param.copy_(out.fused.reshape(shape))
        matrices.append({"name": name, "shape": list(shape), "rank": out.rank, "full_rank": out.full_rank,
                         "retained_energy": round(out.retained_energy, 6), "anchor_norm": out.anchor_norm,
                         "donor_norm": out.donor_norm, "donor_component_norm": out.donor_component_norm})
        now = time.monotonic()
        if now - last > 5 or i + 1 == len(todo):  # progress for big models, quiet for small ones
            log(f"  fused {i + 1}/{len(todo)} matrices ({now - start:.0f}s)")
            last = now
    anchor_energy = sum(m["anchor_norm"] ** 2 for m in matrices)
    donor_energy = sum(m["donor_norm"] ** 2 for m in matrices)
    summary = {
        "matrices": len(matrices), "copied_from_anchor": len(copied),
        # Energy-weighted over all matrices: Σ‖P_a‖² / Σ‖Δ_a‖² and Σ‖C_d‖² / Σ‖Δ_d‖².
        "anchor_energy_retained": (sum(m["retained_energy"] * m["anchor_norm"] ** 2 for m in matrices)
                                   / anchor_energy if anchor_energy else 1.0),
        "donor_energy_in_complement": (sum(m["donor_component_norm"] ** 2 for m in matrices) / donor_energy
                                       if donor_energy else 0.0),
        "mean_rank_fraction": sum(m["rank"] / m["full_rank"] for m in matrices) / max(len(matrices), 1),
    }
    return {"summary": summary, "matrices": matrices, "copied_from_anchor": copied}


def fuse(anchor: str, donor: str, base: str, output: str | Path, settings: FuseSettings | None = None,
         overwrite: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fuse and write ``output`` (an HF folder plus ``fuse.json``) atomically; returns fuse.json's content."""
    settings = settings or FuseSettings()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(output)
    if out.is_file():
        raise ConfigError(f"output {out} is a file; -o names the folder to write")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"output {out} already exists; choose another -o or pass --overwrite")
    sources = {}
    for role, spec in (("base", base), ("anchor", anchor), ("donor", donor)):
        resolved = resolve_source(spec, role)  # every path checked before the slow loads
        if Path(resolved).exists() and out.exists() and Path(resolved).resolve() == out.resolve():
            raise ConfigError(f"output {out} is the {role} itself; write the fused model elsewhere")
        sources[role] = resolved
    models = {role: load_source(spec, role, log)[1] for role, spec in
              (("base", base), ("anchor", anchor), ("donor", donor))}
    start = time.monotonic()
    report = fuse_models(models["base"].model, models["anchor"].model, models["donor"].model, settings, log)
    info = {"method": "surge", "anchor": anchor, "donor": donor, "base": base, "resolved": sources,
            "settings": asdict(settings), "seconds": round(time.monotonic() - start, 2), **report}
    with atomic_directory(out, overwrite=overwrite) as tmp:
        models["anchor"].save(tmp)  # the anchor's config and tokenizer with the fused weights
        (tmp / FUSE_FILE).write_text(json.dumps(info, indent=1) + "\n")
    s = info["summary"]
    log(f"fused {s['matrices']} matrices (mean rank {s['mean_rank_fraction']:.2f} of full; anchor energy kept "
        f"{s['anchor_energy_retained']:.3f}; donor energy in the complement {s['donor_energy_in_complement']:.3f}) "
        f"-> {out}")
    return info
