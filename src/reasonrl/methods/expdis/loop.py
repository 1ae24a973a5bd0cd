"""ExpDis (Exploration–Distillation): rounds of explore → filter → distil (→ plain GRPO).

Paper: "ExpDis: Exploration–Distillation"; paper not located; formalised from its abstract, confidence INFERRED;
``docs/methods/expdis.md`` is the method page. Round r with student θ_r:

1. K explorers φ_k ← θ_r, one after another, each a ``Trainer`` run of S = ``train.steps``
   steps of the recipe as written: the ``novelty`` advantage (Â = A^base + β·N(y)·1[R(y)=1])
   and the ``novelty_memory`` method. Explorer k's memory starts from every correct solution
   of earlier rounds (``round_{r-1}/memory.jsonl``) and of explorers 0..k−1 of this round
   (their ``novelty_samples.jsonl``), so later explorers are pushed away from what earlier ones
   found. Explorer k of round r trains with seed ``train.seed + 100·r + k`` (its own prompts
   and samples).
2. Filter the explorers' correct samples (``reasonrl.methods.expdis.advantage.filter_solutions``): N ≥ τ_N,
   not truncated, at most ``max_tokens``, near-duplicates (n-gram Jaccard ≥ τ_dup) removed.
3. Distil: SFT of θ_r on the kept (prompt, response) pairs, response tokens only
   (``reasonrl.train.sft``), warm-started from θ_r.
4. Optionally ``student_steps`` of plain GRPO on the student (the recipe with the ``base``
   advantage and without ``novelty_memory``), every round or after the last one only.

Every phase's result goes into ``expdis_state.json`` (written atomically) as it completes;
``resume`` skips completed phases, resumes a crashed ``Trainer`` phase from its last checkpoint
and reruns a crashed SFT (deterministic, from θ_r), so a resumed loop ends with the same
weights as a straight one. Explorers start from the student through a ``model:`` section
``{backend: hf, path: <phase>/final_model}`` (the first round from the recipe's own model).

Output folder::

    expdis_state.json   recipe, completed phases with their metrics (the resume point)
    expdis_rounds.jsonl one row per completed phase (explorer counts, filter counts, SFT loss,
                        student pass@1/pass@k): rewritten from the state after each phase
    summary.json        at the end; final_model/ the last student
    round_<r>/explorer_<k>/  Trainer runs; round_<r>/{distill,memory}.jsonl; round_<r>/sft/;
    round_<r>/student/  Trainer run (plain GRPO)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from reasonrl.methods.expdis.advantage import filter_solutions
from reasonrl.methods.expdis.settings import METHOD, ExpDisSettings, settings_from  # noqa: F401  (part of this module's API)
from reasonrl.params import ConfigError
from reasonrl.recipe import load_recipe, recipe_from_dict
from reasonrl.sections import Recipe
from reasonrl.fsutil import atomic_directory, atomic_write_text

__all__ = ["ExpDisSettings", "settings_from", "load_expdis_recipe", "saved_recipe", "ExpDisLoop", "STATE_FILE"]

STATE_FILE = "expdis_state.json"
ROUNDS_FILE = "expdis_rounds.jsonl"
ADVANTAGE = "novelty"


def _method_entry(d: dict) -> dict:
    entries = [m for m in d.get("methods", []) if m.get("name") == METHOD]
    if len(entries) != 1:
        raise ConfigError(f"reasonrl expdis: the recipe needs exactly one `{METHOD}` entry in `methods:` (the "
                          f"explorers' memory of correct solutions), found {len(entries)}")
    return entries[0]


def load_expdis_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """``load_recipe`` where ``--set expdis.<key>=<value>`` sets the loop's settings (which live in
    the ``novelty_memory`` entry of ``methods:``, a list ``--set`` cannot address)."""
    loop = [o for o in overrides or [] if o.strip().startswith("expdis.")]
    recipe = load_recipe(path, [o for o in overrides or [] if o not in loop])
    if not loop:
        return recipe
    d = recipe.to_dict()
    entry = _method_entry(d)
    expdis = dict(entry.get("expdis") or {})
    for item in loop:
        if "=" not in item:
            raise ConfigError(f"--set expects key.sub=value, got '{item}'")
        key, value = item.split("=", 1)
        expdis[key.strip()[len("expdis."):]] = yaml.safe_load(value) if value.strip() else None
    entry["expdis"] = expdis
    return recipe_from_dict(d, f"{path} (with --set)")


def saved_recipe(out: str | Path) -> Recipe:
    path = Path(out) / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"--resume {out}: not an ExpDis output folder (no {STATE_FILE})")
    return recipe_from_dict(json.loads(path.read_text())["recipe"], str(path))


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ExpDisLoop:
    def __init__(self, recipe: Recipe, out: str | Path, resume: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.recipe = recipe
        self.out = Path(out)
        self.resume = resume
        self.log = log or _stderr
        self.base = recipe.to_dict()
        if recipe.advantage.name != ADVANTAGE:
            raise ConfigError(f"reasonrl expdis: the recipe is the explorers' recipe: it needs `advantage: "
                              f"{{name: {ADVANTAGE}, base: grpo, beta: ...}}`, got '{recipe.advantage.name}'")
        self.settings = settings_from(_method_entry(self.base).get("expdis"))
        if recipe.model.lora is not None:
            raise ConfigError("reasonrl expdis: model.lora is not supported (explorers and the student are "
                              "passed between phases as full saved models)")

    # -- derived recipes -----------------------------------------------------
    def _model(self, path: str | None) -> dict:
        if path is None:  # round 1: the recipe's own model
            return dict(self.base["model"])
        return {**self.base["model"], "backend": "hf", "path": path, "gguf_file": None, "tiny": {}}

    def explorer_recipe(self, r: int, k: int, student: str | None, memory_files: list[str]) -> Recipe:
        d = json.loads(json.dumps(self.base))
        d["model"] = self._model(student)
        d["train"]["seed"] = self.recipe.train.seed + 100 * r + k
        entry = _method_entry(d)
        entry.pop("expdis", None)
        entry.update(memory_files=memory_files, record=True)
        if not self.settings.explorer_eval:
            d["eval"]["size"] = 0
        return recipe_from_dict(d, f"ExpDis round {r} explorer {k}")

    def student_recipe(self, r: int, student: str | None) -> Recipe:
        d = json.loads(json.dumps(self.base))
        d["model"] = self._model(student)
        d["train"]["seed"] = self.recipe.train.seed + 100 * r + 99
        d["train"]["steps"] = self.settings.student_steps
        adv = self.recipe.advantage.params
        d["advantage"] = {"name": adv.get("base", "grpo"), **(adv.get("base_params") or {})}
        d["methods"] = [m for m in d["methods"] if m.get("name") != METHOD]
        return recipe_from_dict(d, f"ExpDis round {r} student")

    # -- state ---------------------------------------------------------------
    def _save(self) -> None:
        atomic_write_text(self.out / STATE_FILE, json.dumps(self.state, indent=1))
        rows = [{"phase": name, **result} for name, result in self.state["done"].items()]
        atomic_write_text(self.out / ROUNDS_FILE, "".join(json.dumps(row) + "\n" for row in rows))

    def _phase(self, name: str, fn: Callable[[], dict]) -> dict:
        done = self.state["done"]
        if name in done:
            return done[name]
        self.log(f"expdis: {name}")
        start = time.perf_counter()
        result = fn()
        # Seconds this phase took in this process (a phase resumed after a crash counts its last part only).
        result["wall_s"] = round(time.perf_counter() - start, 2)
        done[name] = result
        self._save()
        return result

    def _train(self, recipe: Recipe, run_dir: Path) -> dict:
        from reasonrl.train import checkpoint as ckpt
        from reasonrl.train.trainer import Trainer

        resume = bool(ckpt.list_checkpoints(run_dir))
        if run_dir.exists() and not resume:  # crashed before its first checkpoint: start it again
            shutil.rmtree(run_dir)
        return Trainer(recipe, run_dir, resume=resume, log=self.log).run()

    def _evaluate(self, model_path: str | None) -> dict[str, float]:
        from reasonrl.evaluate.evaluator import Evaluator
        from reasonrl.policy.factory import build_policy
        from reasonrl.metrics_log import finite_or_none
        from reasonrl.train.trainer import build_task, seed_everything

        r = self.recipe
        if not r.eval.size:
            return {}
        seed_everything(r.train.seed)
        policy = build_policy(recipe_from_dict({**self.base, "model": self._model(model_path)}, "ExpDis eval").model,
                              log=self.log, trainable=False)
        return {k: finite_or_none(v) for k, v in Evaluator(r, build_task(r))(policy).metrics.items()}

    # -- the loop ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import torch

        if self.recipe.train.threads:
            torch.set_num_threads(self.recipe.train.threads)
        state_path = self.out / STATE_FILE
        if self.resume:
            if not state_path.is_file():
                raise ConfigError(f"--resume {self.out}: not an ExpDis output folder (no {STATE_FILE})")
            self.state = json.loads(state_path.read_text())
            if self.state["recipe"] != self.base:
                raise ConfigError(f"--resume {self.out}: the recipe differs from the one the run started with")
            self.log(f"expdis: resuming {self.out}: {len(self.state['done'])} phases done")
        else:
            if self.out.exists() and any(self.out.iterdir()):
                raise ConfigError(f"output folder {self.out} is not empty; use --resume to continue it")
            self.out.mkdir(parents=True, exist_ok=True)
            self.state = {"version": 1, "recipe": self.base, "done": {}}
            self._save()
        s = self.settings
        start_eval = self._phase("start/eval", lambda: {"kind": "eval", "eval": self._evaluate(None)})
        student: str | None = None  # None: the recipe's own model
        memory: str | None = None
        for r in range(1, s.rounds + 1):
            rdir = self.out / f"round_{r}"
            samples = []
            for k in range(s.explorers):
                files = ([memory] if memory else []) + samples
                run_dir = rdir / f"explorer_{k}"
                recipe = self.explorer_recipe(r, k, student, files)
                self._phase(f"round_{r}/explorer_{k}",
                            lambda: self._explorer_result(r, k, self._train(recipe, run_dir), run_dir, files))
                samples.append(str(run_dir / "novelty_samples.jsonl"))
            self._phase(f"round_{r}/filter", lambda: self._filter(r, rdir, memory, samples))
            memory = str(rdir / "memory.jsonl")
            grpo = s.student_steps > 0 and (s.student_phase == "every_round" or r == s.rounds)
            sft = self._phase(f"round_{r}/sft", lambda: self._sft(r, rdir, student, evaluate=not grpo))
            student = sft["model"]
            if grpo:
                run_dir = rdir / "student"
                recipe = self.student_recipe(r, student)
                res = self._phase(f"round_{r}/student",
                                  lambda: self._student_result(r, self._train(recipe, run_dir), run_dir))
                student = res["model"]
        final = self._phase("final", lambda: self._final(student))
        summary = self._summary(start_eval, final)
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=1))
        return summary

    # -- phases --------------------------------------------------------------
    def _explorer_result(self, r: int, k: int, summary: dict, run_dir: Path, memory_files: list[str]) -> dict:
        from reasonrl.methods.expdis.method import read_records

        path = run_dir / "novelty_samples.jsonl"
        if not path.is_file():  # no step reached the memory (every batch was empty): no samples
            atomic_write_text(path, "")
        records = read_records(path)
        before = {(m["prompt"], m["completion"]) for f in memory_files for m in read_records(f)}
        distinct = {(m["prompt"], m["completion"]) for m in records}
        novelty = [float(m["novelty"]) for m in records]
        return {"kind": "explorer", "round": r, "explorer": k, "steps": summary["steps"],
                "correct_samples": len(records), "distinct_correct": len(distinct),
                "distinct_correct_new": len(distinct - before),
                "prompts_solved": len({m["prompt"] for m in records}),
                "mean_novelty": sum(novelty) / len(novelty) if novelty else 0.0,
                "eval": summary.get("final_eval", {}), "train_wall_s": summary.get("wall_seconds")}

    def _filter(self, r: int, rdir: Path, memory: str | None, samples: list[str]) -> dict:
        from reasonrl.methods.expdis.method import read_records

        method = _method_entry(self.base)
        records = [rec for f in samples for rec in read_records(f)]
        result = filter_solutions(records, tau_n=self.settings.tau_n, tau_dup=self.settings.tau_dup,
                                  n=int(method.get("n", 3)), unit=method.get("unit", "char"),
                                  max_tokens=self.settings.max_tokens)
        atomic_write_text(rdir / "distill.jsonl", "".join(json.dumps(rec) + "\n" for rec in result.kept))
        previous = read_records(memory) if memory else []
        merged = previous + [{k: rec.get(k) for k in ("prompt", "completion", "pred")} for rec in records]
        atomic_write_text(rdir / "memory.jsonl", "".join(json.dumps(rec) + "\n" for rec in merged))
        return {"kind": "filter", "round": r, **result.counts,
                "distinct_correct": len({(m["prompt"], m["completion"]) for m in records}),
                "distinct_kept_prompts": len({m["prompt"] for m in result.kept}), "memory_size": len(merged)}

    def _sft(self, r: int, rdir: Path, student: str | None, evaluate: bool) -> dict:
        from reasonrl.methods.expdis.method import read_records
        from reasonrl.policy.factory import build_policy
        from reasonrl.train.sft import SFTExample, response_nll, sft
        from reasonrl.train.trainer import seed_everything

        s, rc = self.settings, self.recipe
        kept = read_records(rdir / "distill.jsonl")
        out: dict[str, Any] = {"kind": "sft", "round": r, "examples": len(kept)}
        if not kept:
            self.log(f"expdis: round {r}: the filter kept nothing; the student is unchanged")
            out.update(model=student, skipped=True)
        else:
            seed = rc.train.seed + 100 * r + 98
            seed_everything(seed)
            policy = build_policy(recipe_from_dict({**self.base, "model": self._model(student)}, "ExpDis SFT").model,
                                  log=self.log)
            examples = [SFTExample(rec["prompt"], tuple(rec["completion_ids"])) for rec in kept]
            mb = s.sft_micro_batch_size or rc.train.micro_batch_size
            optim = dataclasses.replace(rc.optim, lr=s.sft_lr or rc.optim.lr)
            out["nll_before"] = response_nll(policy, examples, mb)
            out.update(sft(policy, examples, optim, epochs=s.sft_epochs, batch_size=s.sft_batch_size,
                           micro_batch_size=mb, seed=seed, log=self.log))
            out["nll_after"] = response_nll(policy, examples, mb)
            target = rdir / "sft" / "final_model"
            with atomic_directory(target, overwrite=True) as tmp:
                policy.save(tmp)
            out["model"] = str(target)
        if evaluate:
            out["eval"] = self._evaluate(out["model"])
        return out

    def _student_result(self, r: int, summary: dict, run_dir: Path) -> dict:
        return {"kind": "student", "round": r, "steps": summary["steps"], "model": str(run_dir / "final_model"),
                "eval_before": summary.get("base_eval", {}), "eval": summary.get("final_eval", {}),
                "train_wall_s": summary.get("wall_seconds")}

    def _final(self, student: str | None) -> dict:
        target = self.out / "final_model"
        if student is None:  # nothing was ever distilled: the final model is the recipe's own
            from reasonrl.policy.factory import build_policy

            policy = build_policy(recipe_from_dict(self.base, "ExpDis").model, log=self.log, trainable=False)
            with atomic_directory(target, overwrite=True) as tmp:
                policy.save(tmp)
        else:
            with atomic_directory(target, overwrite=True) as tmp:
                shutil.copytree(student, tmp, dirs_exist_ok=True)
        return {"kind": "final", "model": str(target)}

    def _summary(self, start_eval: dict, final: dict) -> dict:
        done = self.state["done"]
        rounds = []
        for r in range(1, self.settings.rounds + 1):
            explorers = [done[f"round_{r}/explorer_{k}"] for k in range(self.settings.explorers)]
            sft = done[f"round_{r}/sft"]
            student = done.get(f"round_{r}/student")
            rounds.append({
                "round": r,
                "explorer_correct": [e["correct_samples"] for e in explorers],
                "explorer_distinct_correct": [e["distinct_correct"] for e in explorers],
                "explorer_distinct_correct_new": [e["distinct_correct_new"] for e in explorers],
                "filter": {k: v for k, v in done[f"round_{r}/filter"].items() if k not in ("kind", "round", "wall_s")},
                "sft_loss": [sft.get("sft/loss_first"), sft.get("sft/loss_last")],
                "eval_after_sft": student["eval_before"] if student else sft.get("eval", {}),
                "eval_after_student": student["eval"] if student else None,
            })
        last = rounds[-1]
        final_eval = last["eval_after_student"] or last["eval_after_sft"]
        return {"out": str(self.out), "final_model": final["model"], "start_eval": start_eval.get("eval", {}),
                "final_eval": final_eval, "rounds": rounds,
                "wall_seconds": round(sum(float(v.get("wall_s") or 0.0) for v in done.values()), 2)}
