"""SRD (Self-Retrospection Distillation) on the method hooks: the policy, shown its own
rollouts and the gold answer, writes a foresight; the same policy without that hindsight is
pulled toward the informed one on the foresight's tokens. The maths and its (INFERRED) source
are in ``reasonrl.methods.srd.maths``; ``docs/methods/srd.md`` has the method page.

    methods:
      - name: srd
        coef: 0.5               # λ_SRD
        beta: 0.5               # JSD_β
        max_groups: null        # groups distilled per step (null: every group of the batch)
        foresight_max_tokens: 16

Pipeline, per training step:

- ``annotate`` (after selection, before advantages): for each distilled group, build H from
  its scored rollouts (successes → knowledge, failures → pitfalls) and y*, render c_T(x, H) and
  c_S(x) from the templates, fit c_T plus the foresight budget into the model's context
  (dropping trajectories, see ``fit_hindsight``), and sample one foresight f per group from
  c_T with the current policy, without gradient. The group's views and f are written into
  ``batch.aux`` on **the group's first row in the batch**; every other row has zero masks.
- ``loss_term`` (every micro-batch of the update): for the micro-batch's rows that carry a
  foresight, one no-grad forward of the teacher view (the current θ, stop-gradient) and one
  forward with gradient of the student view, both predicting f; the per-foresight mean JSD is
  summed and divided by the number of foresight rows in the whole **mini-batch**, so summing
  micro-batches gives the mini-batch's L_SRD whatever the split (a row is never split).

The foresight is sampled with a generator of this method's own (seeded from ``train.seed``,
saved in checkpoints): resume is exact, and the run's rollout stream is the one plain GRPO
draws, so ``coef: 0`` trains bit-for-bit like GRPO while the whole pipeline still runs.

Metrics: ``srd/jsd`` (token mean of the JSD over every foresight token the update saw, before
each optimiser step), ``srd/loss`` (L_SRD per optimiser step, before λ), ``srd/groups``,
``srd/uniform_group_fraction`` (share of the batch's groups whose rewards all agree),
``srd/uniform_distilled_fraction``, ``srd/foresight_len``, ``srd/knowledge`` and
``srd/pitfalls`` (trajectories kept in H per group), ``srd/skipped_groups`` (bare c_T too long
for the context), ``srd/foresight_reward`` (the task's reward of f, when the run scores in the
learner: is the informed view actually better?), ``perf/srd_foresight_s``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.methods.srd.maths import (ITEM_FIELDS, STUDENT_FIELDS, TEACHER_FIELDS, fit_hindsight, foresight_jsd,
                                group_first_rows, hindsight, per_foresight_mean, render_student, render_teacher,
                                template_fields, uniform_groups)
from reasonrl.batch import RolloutBatch
from reasonrl.params import ConfigError
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["SelfRetrospectionDistillation", "AUX_KEYS"]

TEACHER_IDS, TEACHER_MASK = "srd_teacher_ids", "srd_teacher_mask"
STUDENT_IDS, STUDENT_MASK = "srd_student_ids", "srd_student_mask"
FORESIGHT_IDS, FORESIGHT_MASK = "srd_foresight_ids", "srd_foresight_mask"
AUX_KEYS = (TEACHER_IDS, TEACHER_MASK, STUDENT_IDS, STUDENT_MASK, FORESIGHT_IDS, FORESIGHT_MASK)

# Defaults in the embedded tokenizer's alphabet (0-9 + - * ( ) = ; #): H before the task, each
# success marked "+#", each failure "-#", then the gold answer in the task's own "####N" form.
# A word model would use words (docs/methods/srd.md has an example).
TEACHER_TEMPLATE = "{knowledge}{pitfalls}####{answer};{prompt}"
KNOWLEDGE_ITEM = "+#{completion}"
PITFALL_ITEM = "-#{completion}"
STUDENT_TEMPLATE = "{prompt}"
SEED_OFFSET = 0x5D  # the foresight generator's seed is train.seed + this (any fixed offset)

TEMPLATE_RULES = {  # key: (allowed placeholders, required placeholders)
    "teacher_template": (TEACHER_FIELDS, {"prompt"}),
    "student_template": (STUDENT_FIELDS, {"prompt"}),
    "knowledge_item": (ITEM_FIELDS, {"completion"}),
    "pitfall_item": (ITEM_FIELDS, {"completion"}),
}


def template_problems(templates: dict[str, str]) -> list[str]:
    """Why each template is unusable (empty list: all fine): malformed, an unknown placeholder,
    a missing {prompt}/{completion}, or privileged information (y*, H) in the student view."""
    problems = []
    for key, (allowed, required) in TEMPLATE_RULES.items():
        try:
            fields = template_fields(templates[key])
        except ValueError as e:
            problems.append(f"methods[srd]: {key} {templates[key]!r} is not a format string ({e})")
            continue
        extra, missing = fields - allowed, required - fields
        if extra and key == "student_template":
            problems.append(f"methods[srd]: student_template {templates[key]!r} uses {sorted(extra)}: the student "
                            "(trajectory-blind) view may contain only {prompt}; the gold answer and the hindsight "
                            "go to teacher_template only")
        elif extra:
            problems.append(f"methods[srd]: {key} {templates[key]!r} has unknown placeholders {sorted(extra)}; "
                            f"allowed: {sorted(allowed)}")
        if missing:
            problems.append(f"methods[srd]: {key} {templates[key]!r} needs {{{sorted(missing)[0]}}}")
    return problems


def trim_left(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Left-padded rows without the padding columns every row has."""
    width = max(1, int(mask.sum(-1).max()))
    return ids[:, -width:], mask[:, -width:]


def trim_right(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    width = max(1, int(mask.sum(-1).max()))
    return ids[:, :width], mask[:, :width]


@METHODS.register("srd")
class SelfRetrospectionDistillation(Method):
    writes = AUX_KEYS

    def __init__(self,
                 coef: Annotated[float, Range(ge=0, why="λ_SRD, the weight of the foresight distillation")] = 0.5,
                 beta: Annotated[float, Range(ge=0, le=1, why="JSD_β's interpolation; 0.5 is the symmetric JSD")] = 0.5,
                 max_groups: Optional[Annotated[int, Range(ge=1)]] = None,
                 groups: Literal["all", "uniform"] = "all",
                 foresight_max_tokens: Annotated[int, Range(ge=1)] = 16,
                 temperature: Optional[Annotated[float, Range(gt=0)]] = None,
                 num_knowledge: Annotated[int, Range(ge=0)] = 1,
                 num_pitfalls: Annotated[int, Range(ge=0)] = 1,
                 success_threshold: float = 0.5,
                 max_context: Optional[Annotated[int, Range(ge=2)]] = None,
                 teacher_template: str = TEACHER_TEMPLATE,
                 student_template: str = STUDENT_TEMPLATE,
                 knowledge_item: str = KNOWLEDGE_ITEM,
                 pitfall_item: str = PITFALL_ITEM) -> None:
        """``coef``: λ_SRD. ``beta``: JSD_β (GKD's convention; 0 → forward KL(teacher‖student),
        1 → reverse KL). ``max_groups``: at most this many groups distilled per step, the first in
        the batch (null: all); ``groups``: ``all`` or only ``uniform`` ones (every reward equal,
        where GRPO has no gradient). ``foresight_max_tokens``: |f| budget. ``temperature``: of the
        foresight sampling (null: ``rollout.temperature``; the JSD always uses the rollout's).
        ``num_knowledge``/``num_pitfalls``: distinct successful/failed rollouts put into H;
        success is reward > ``success_threshold``. ``max_context``: positions c_T + f may take
        (null: the model's ``max_position_embeddings``); trajectories that do not fit are dropped.
        Templates: ``teacher_template`` ({prompt}, {answer}, {knowledge}, {pitfalls}),
        ``student_template`` ({prompt} only), ``knowledge_item``/``pitfall_item`` ({completion})."""
        self.coef, self.beta, self.max_groups, self.groups = coef, beta, max_groups, groups
        self.foresight_max_tokens, self.temperature = foresight_max_tokens, temperature
        self.num_knowledge, self.num_pitfalls, self.success_threshold = num_knowledge, num_pitfalls, success_threshold
        self.max_context = max_context
        self.templates = {"teacher_template": teacher_template, "student_template": student_template,
                          "knowledge_item": knowledge_item, "pitfall_item": pitfall_item}
        problems = template_problems(self.templates)
        if problems:
            raise ConfigError("; ".join(problems))
        self._reset_stats()

    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": (AUX_KEYS, ()), "loss_term": ((), AUX_KEYS)}

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        templates = {k: config.get(k, d) for k, d in (("teacher_template", TEACHER_TEMPLATE),
                                                      ("student_template", STUDENT_TEMPLATE),
                                                      ("knowledge_item", KNOWLEDGE_ITEM),
                                                      ("pitfall_item", PITFALL_ITEM))}
        for problem in template_problems(templates):
            need(False, problem)

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.rollout.collect import stop_strings

        self.policy, self.scorer = ctx.policy, ctx.scorer
        r = ctx.recipe
        self.rollout_temperature = r.rollout.temperature
        self.sample_temperature = self.temperature if self.temperature is not None else r.rollout.temperature
        self.stop = stop_strings(r, ctx.task) if ctx.task is not None else None
        positions = getattr(self.policy.model.config, "max_position_embeddings", None)
        self.context = self.max_context or positions
        self.generator = torch.Generator().manual_seed(r.train.seed + SEED_OFFSET)
        self._check_encodable()

    def _check_encodable(self) -> None:
        """Every literal character of every template must be a token the model knows: the
        embedded char tokenizer maps others to <unk>, which would silently blind the view."""
        tok = self.policy.tokenizer
        unk = tok.unk_token_id
        if unk is None:
            return  # byte-level tokenizers encode anything
        blanks = {f: "" for f in TEACHER_FIELDS | ITEM_FIELDS}
        for key, template in self.templates.items():
            literal = template.format(**blanks)
            if unk in tok(literal, add_special_tokens=False)["input_ids"]:
                bad = sorted({c for c in literal if unk in tok(c, add_special_tokens=False)["input_ids"]})
                raise ConfigError(f"methods[srd]: {key} {template!r} has characters the model's tokenizer does not "
                                  f"know: {bad}; write the template in the tokenizer's alphabet (the embedded "
                                  "model's is 0-9 + - * ( ) = ; #)")

    # -- annotate: hindsight, views, foresight --------------------------------------------
    def _length(self, text: str) -> int:
        return int(self.policy.encode_prompts([text])[1].sum())

    def _teacher_view(self, prompt: str, answer: str, knowledge: list[str], pitfalls: list[str]):
        t = self.templates

        def render(k, p):
            return render_teacher(t["teacher_template"], t["knowledge_item"], t["pitfall_item"], prompt, answer, k, p)

        def fits(k, p):
            return self.context is None or self._length(render(k, p)) + self.foresight_max_tokens <= self.context

        kept = fit_hindsight(knowledge, pitfalls, fits)
        return None if kept is None else (render(*kept), *kept)

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        self._reset_stats()
        started = time.perf_counter()
        n, device = len(batch), self.policy.device
        uniform = uniform_groups(batch.rewards, batch.group_ids)
        rewards, meta = batch.rewards.tolist(), batch.meta
        chosen, views, students, kept_k, kept_p, skipped = [], [], [], 0, 0, 0
        for gid, rows in group_first_rows(batch.group_ids):
            if self.groups == "uniform" and not uniform[gid]:
                continue
            if self.max_groups is not None and len(chosen) >= self.max_groups:
                break
            knowledge, pitfalls = hindsight([meta["completion"][i] for i in rows], [rewards[i] for i in rows],
                                            self.success_threshold, self.num_knowledge, self.num_pitfalls)
            prompt = meta["prompt"][rows[0]]
            view = self._teacher_view(prompt, str(meta["answer"][rows[0]]), knowledge, pitfalls)
            if view is None:
                skipped += 1
                continue
            chosen.append((gid, rows[0]))
            views.append(view[0])
            students.append(render_student(self.templates["student_template"], prompt))
            kept_k, kept_p = kept_k + len(view[1]), kept_p + len(view[2])
        pad = self.policy.tokenizer.pad_token_id
        aux = {TEACHER_IDS: torch.full((n, 1), pad, dtype=torch.long), TEACHER_MASK: torch.zeros((n, 1), dtype=torch.long),
               STUDENT_IDS: torch.full((n, 1), pad, dtype=torch.long), STUDENT_MASK: torch.zeros((n, 1), dtype=torch.long),
               FORESIGHT_IDS: torch.full((n, 1), pad, dtype=torch.long),
               FORESIGHT_MASK: torch.zeros((n, 1), dtype=torch.long)}
        metrics = {"srd/groups": len(chosen), "srd/skipped_groups": skipped,
                   "srd/uniform_group_fraction": sum(uniform.values()) / max(len(uniform), 1)}
        if chosen:
            # One foresight per group, from the retrospective view, by the current policy (no gradient).
            s = self.policy.sample(views, 1, self.foresight_max_tokens, self.sample_temperature,
                                   generator=self.generator, stop=self.stop)
            s_ids, s_mask = self.policy.encode_prompts(students)
            first = torch.tensor([row for _, row in chosen])
            for (ids_key, mask_key), (ids, mask) in (((TEACHER_IDS, TEACHER_MASK), (s.prompt_ids, s.prompt_mask)),
                                                     ((STUDENT_IDS, STUDENT_MASK), (s_ids, s_mask)),
                                                     ((FORESIGHT_IDS, FORESIGHT_MASK),
                                                      (s.completion_ids, s.completion_mask))):
                aux[ids_key] = torch.full((n, ids.shape[1]), pad, dtype=torch.long)
                aux[mask_key] = torch.zeros((n, ids.shape[1]), dtype=torch.long)
                aux[ids_key][first], aux[mask_key][first] = ids.cpu().long(), mask.cpu().long()
            lengths = s.completion_mask.sum(-1).float()
            metrics.update({"srd/foresight_len": float(lengths.mean()), "srd/knowledge": kept_k / len(chosen),
                            "srd/pitfalls": kept_p / len(chosen),
                            "srd/uniform_distilled_fraction": sum(uniform[g] for g, _ in chosen) / len(chosen)})
            if self.scorer is not None:  # the teacher view's own answers: does the hindsight help?
                problems = [meta["problem"][row] for _, row in chosen] if "problem" in meta else None
                if problems is not None:
                    scores = self.scorer(s.texts, problems, lengths.long().tolist(), s.truncated.tolist())
                    metrics["srd/foresight_reward"] = sum(scores.total) / len(scores.total)
        batch.aux.update({k: v.to(device) for k, v in aux.items()})
        metrics["perf/srd_foresight_s"] = time.perf_counter() - started
        return metrics

    # -- the loss term ------------------------------------------------------------------
    def loss_term(self, inputs: Any) -> tuple[Tensor, dict[str, float]]:
        micro = inputs.micro
        if inputs.mini is not self._mini:  # a new optimiser step (mini-batch or pass) begins
            self._mini, self._steps = inputs.mini, self._steps + 1
        rows = torch.nonzero(micro.aux[FORESIGHT_MASK].sum(-1) > 0).squeeze(-1)
        if len(rows) == 0:
            return torch.zeros((), device=inputs.logits.device), {}
        # Normalised by the foresights of the whole mini-batch, never the micro-batch's.
        total = int((inputs.mini.aux[FORESIGHT_MASK].sum(-1) > 0).sum())
        aux = {k: v[rows] for k, v in micro.aux.items() if k in AUX_KEYS}
        f_ids, f_mask = trim_right(aux[FORESIGHT_IDS], aux[FORESIGHT_MASK])
        t_ids, t_mask = trim_left(aux[TEACHER_IDS], aux[TEACHER_MASK])
        s_ids, s_mask = trim_left(aux[STUDENT_IDS], aux[STUDENT_MASK])
        with torch.no_grad():  # π_sg(θ): the same weights, no gradient through the teacher view
            t_logits = self.policy.completion_logits(t_ids, t_mask, f_ids, f_mask)
        s_logits = self.policy.completion_logits(s_ids, s_mask, f_ids, f_mask)
        jsd = foresight_jsd(s_logits, t_logits, self.beta, inputs.temperature)
        term = per_foresight_mean(jsd, f_mask).sum() / total
        self._jsd_sum += float((jsd.detach() * f_mask).sum())
        self._tokens += float(f_mask.sum())
        self._loss_sum += float(term.detach())
        return self.coef * term, {}

    def _reset_stats(self) -> None:
        self._mini, self._steps, self._jsd_sum, self._tokens, self._loss_sum = None, 0, 0.0, 0.0, 0.0

    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        out = {}
        if self._tokens:
            out = {"srd/jsd": self._jsd_sum / self._tokens, "srd/loss": self._loss_sum / max(self._steps, 1)}
        self._mini = None  # hold no batch past its step
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "generator" in state:
            self.generator.set_state(state["generator"])
