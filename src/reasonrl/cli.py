"""The reasonrl command line: train, eval, report, list, describe, quickstart, sandbox, expdis, fuse, fed-sim, fed-server, fed-client.

Exit codes: 0 success, 2 bad input (recipe, arguments, data, an unknown name), 1 anything else,
130 interrupted (Ctrl-C). The first line above is ``--help``'s description, so it holds no markup.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import reasonrl
from reasonrl import catalog
from reasonrl.api import default_run_dir, resumed_recipe
from reasonrl.params import ConfigError
from reasonrl.recipe import load_recipe, recipe_from_dict
from reasonrl.fsutil import CheckpointWriteError, atomic_write_text
from reasonrl.registry import UnknownNameError, load_components

def cmd_train(args: argparse.Namespace) -> int:
    from reasonrl.hooks import method_specs
    from reasonrl.train.fsdp import check_shardable
    from reasonrl.train.launch import launch_torchrun, launched_rank, run_rank
    from reasonrl.train.trainer import RECIPE_FILE, NonFiniteError, Trainer
    from reasonrl.rollout.vllm_engine import EngineError

    ranked = launched_rank()  # (rank, size) when torchrun (or Slurm, or Ray) started this process
    writer = ranked is None or ranked[0] == 0  # the one process that writes the run folder and talks to the user
    # A launched rank's parent (reasonrl train --nproc N) has told the user already.
    talks = ranked is None
    if args.resume:
        run_dir = Path(args.resume)
        args.run_dir = run_dir  # for the Ctrl-C hint (_interrupted)
        if talks:
            print(f"reasonrl: resuming {run_dir}", file=sys.stderr, flush=True)
        recipe = resumed_recipe(run_dir, args.set, RECIPE_FILE, write=writer, talks=talks)
    else:
        if not args.recipe:
            raise ConfigError("train needs a RECIPE.yaml (or --resume RUN_DIR)")
        recipe = load_recipe(args.recipe, args.set)
        run_dir = Path(args.output) if args.output else default_run_dir(recipe, args.recipe)
        args.run_dir = run_dir
        # Only rank 0 writes the folder; another rank may look after it has begun to.
        if writer and run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"output folder {run_dir} is not empty; use --resume {run_dir} to continue it")
        if talks:
            print(f"reasonrl: run folder {run_dir}", file=sys.stderr, flush=True)
    if args.nproc is not None:  # the number of ranks changes no number of the run: allowed on --resume
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
        recipe.train.nproc = args.nproc
    if ranked is not None:
        recipe.train.nproc = ranked[1]
    elif recipe.train.nproc > 1:
        check_shardable(recipe, method_specs(recipe))  # before any process starts
    if ranked is None and recipe.train.nproc > 1 and recipe.train.engine == "torchrun":
        # On --resume the ranks read the recipe.json written above (train.steps included): no --set to pass on.
        command = ["train", "--resume", str(run_dir)] if args.resume else \
            ["train", args.recipe, *[x for kv in args.set for x in ("--set", kv)], "-o", str(run_dir)]
        code = launch_torchrun(command, recipe.train.nproc, run_dir,
                               lambda msg: print(msg, file=sys.stderr, flush=True))
        if code == 0:
            _print_report_hint(run_dir)
        return code
    try:
        if ranked is not None:
            summary = run_rank(recipe, run_dir, resume=bool(args.resume))
            if summary is None:  # not rank 0: rank 0 reports
                return 0
        elif recipe.train.nproc > 1:  # train.engine: ray
            from reasonrl.train.ray_ranks import run_on_ray

            summary = run_on_ray(recipe, run_dir, resume=bool(args.resume))
        else:
            summary = Trainer(recipe, run_dir, resume=bool(args.resume)).run()
    except NonFiniteError as exc:  # a diagnosis, not a crash: no traceback
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    except EngineError as exc:  # the message names the call and shows the engine's log
        print(f"reasonrl: error: {exc}\nThe last checkpoint is kept: resume with `reasonrl train --resume {run_dir}`",
              file=sys.stderr)
        return 1
    print(json.dumps({k: summary[k] for k in ("run_dir", "steps", "base_accuracy", "final_accuracy", "wall_seconds")}))
    if talks:
        _print_report_hint(run_dir)
    return 0


def _print_report_hint(run_dir: Path) -> None:
    # On stderr: stdout keeps the one JSON line of the summary, for scripts.
    print(f"reasonrl: done; report: reasonrl report {shlex.quote(str(run_dir))}  (add other run folders to compare)",
          file=sys.stderr, flush=True)


def _interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves to do, naming the real folder: resume from its last checkpoint, or,
    before the first one, that there is nothing to resume yet."""
    if args.command == "train":
        run_dir = getattr(args, "run_dir", None)
        if run_dir is None:
            return "; no run folder was written yet"
        from reasonrl.train.checkpoint import list_checkpoints

        checkpoints = list_checkpoints(Path(run_dir))
        if checkpoints:
            return (f"; the last checkpoint is {checkpoints[-1].name}: resume with "
                    f"reasonrl train --resume {shlex.quote(str(run_dir))}")
        if not Path(run_dir).exists():
            return f"; nothing to resume: the run folder {run_dir} was not written yet"
        return (f"; nothing to resume yet: {run_dir} has no checkpoint (train.checkpoint_every sets how often "
                f"they are written); start again with another -o, or remove {run_dir} first")
    out = getattr(args, "output", None) or "OUT"
    return {"expdis": f"; resume with reasonrl expdis --resume -o {out}",
            "fed-sim": f"; resume with reasonrl fed-sim --resume -o {out}",
            "fed-server": f"; resume with reasonrl fed-server --resume -o {out}"}.get(args.command, "")


def cmd_list(args: argparse.Namespace) -> int:
    """Every registered component, or one stage's: summary, parameters and defaults, origin."""
    if args.markdown:
        if args.stage is not None:
            raise ConfigError("--markdown writes the whole catalog (docs/components.md): drop the STAGE")
        return _write(catalog.markdown())
    return _write(catalog.list_text(args.stage) + "\n")


def cmd_describe(args: argparse.Namespace) -> int:
    """One component's whole docstring, recipe entry and parameter table (each stage it is in)."""
    return _write(catalog.describe_text(args.name, args.stage) + "\n")


def _write(text: str) -> int:
    """Write ``text`` to stdout; a reader that stops early (reasonrl list | head) is no error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit fails quietly too
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from reasonrl.quickstart import quickstart

    quickstart(seed=args.seed, output=args.output, overrides=args.set)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import yaml

    from reasonrl.evaluate.cues import Prefilled, evaluate_cues, unescape_cue
    from reasonrl.evaluate.diagnostics import compare_with_baseline, describe_flag
    from reasonrl.evaluate.evaluator import Evaluator
    from reasonrl.policy.factory import load_for_eval
    from reasonrl.train.trainer import build_task

    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    # --recipe gives the task and how it is scored and sampled; a flag given beside it wins.
    source = load_recipe(args.recipe) if args.recipe else None
    args.task = args.task or (source.task.name if source else None)
    if not args.task:
        raise ConfigError("reasonrl eval: give --task NAME or --recipe RECIPE.yaml")
    same_task = source is not None and source.task.name == args.task
    params = dict(source.task.params) if same_task else {}
    for item in args.task_param:
        if "=" not in item:
            raise ConfigError(f"--task-param expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        params[key] = yaml.safe_load(value)
    args.reward = args.reward or (source.eval.reward if same_task else "exact_answer")
    if args.max_new_tokens is None:
        args.max_new_tokens = source.rollout.max_new_tokens if same_task else 64
    stop = [unescape_cue(x) for x in args.stop] or (list(source.rollout.stop or []) if same_task else [])
    # Validated like a recipe: unknown task names or parameters fail with the closest match.
    recipe = recipe_from_dict({
        "task": {"name": args.task, **params},
        "eval": {"size": args.size, "reward": args.reward, "n": args.n, "k": [k for k in (1, args.k) if k <= args.n],
                 "temperature": args.temperature, "seed": args.seed, "batch_size": args.batch_size},
        "rollout": {"max_new_tokens": args.max_new_tokens, **({"stop": stop} if stop else {})}}, "reasonrl eval")
    evaluator = Evaluator(recipe, build_task(recipe))
    evaluator.check_sampled()
    policy = load_for_eval(args.model)
    cues = [unescape_cue(c) for c in args.prefill]
    # The unprefilled samples are kept (Prefilled with no cue) to count each cue's own emissions.
    sampler = Prefilled(policy) if cues else policy
    try:
        for cue in cues:
            Prefilled(policy, cue)  # refuses a cue the tokenizer cannot read, before any sampling
    except ValueError as exc:
        raise ConfigError(f"--prefill: {exc}") from None

    def progress(done: int, total: int) -> None:
        print(f"\r  {done}/{total} problems", end="", file=sys.stderr, flush=True)

    start = time.perf_counter()
    result = evaluator.sampled(sampler, progress=progress)
    if args.baseline_model:  # reward-hacking diagnostics against a reference (evaluate.diagnostics)
        base = evaluator.sampled(load_for_eval(args.baseline_model), progress=progress)
        result["baseline"] = {"model": args.baseline_model, "metrics": base["metrics"]}
        result["vs_baseline"] = compare_with_baseline(result, base)
    if cues:
        result["cues"] = evaluate_cues(evaluator, policy, result, sampler.sampled_texts, cues, progress)
    seconds = time.perf_counter() - start
    print(file=sys.stderr)
    result.update({"model": args.model, "task": args.task, "task_params": params, "reward": args.reward,
                   "temperature": args.temperature, "seed": args.seed, "seconds": round(seconds, 1)})
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps({args.task: result}, indent=1))
    problems = len(evaluator.problems)
    print(f"{args.task}: {problems} problems, n={args.n}, {seconds:.0f}s ({problems / seconds:.2f} problems/s)")
    for name, value in result["metrics"].items():
        if isinstance(value, dict):
            print(f"  {name:<32} {value['mean']:.3f}  [{value['ci_low']:.3f}, {value['ci_high']:.3f}]")
        else:
            print(f"  {name:<32} {value:.3f}")
    if "vs_baseline" in result:
        gap, flag = result["vs_baseline"]["regret_gap"], result["vs_baseline"]["hacking"]
        print(f"  vs {args.baseline_model}: regret gap {gap['mean']:+.3f} [{gap['ci_low']:+.3f}, {gap['ci_high']:+.3f}]"
              f"  reward hacking: {describe_flag(flag)}")
    for cue, rep in result.get("cues", {}).items():
        d = rep["delta_pass@1"]
        print(f"  cue {cue!r}: pass@1 {rep['pass@1']:.3f}  delta {d['mean']:+.3f} [{d['ci_low']:+.3f}, "
              f"{d['ci_high']:+.3f}]  log p(cue) {rep['cue_logprob']:.2f}  emitted at start {rep['emitted']['start']:.3f}")
    print(f"results in {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from reasonrl.evaluate.report import ReportError, stats_path, verdict_lines, write_report

    try:
        out = write_report(args.runs, args.output, title=args.title,
                           warn=lambda w: print(f"warning: {w}", file=sys.stderr),
                           baseline=args.baseline, bootstrap=args.bootstrap)
    except ReportError as exc:
        raise ConfigError(str(exc)) from None
    print(f"report in {out} (plots in {out.parent / (out.stem + '_files')})")
    if args.baseline is not None:
        for line in verdict_lines(json.loads(stats_path(out).read_text())):
            print(line)
        print(f"statistics against {args.baseline} in {stats_path(out)}")
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Run a Python file in the code sandbox as a reward would; one JSON line; 0 iff status ok."""
    from reasonrl.isolation.sandbox import SandboxUnavailable, run_python

    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"sandbox: no such file: {path}")
    try:
        code = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"sandbox: cannot read {path} as UTF-8 text: {exc}") from None
    try:
        result = run_python(code, timeout_s=args.timeout, memory_mb=args.memory_mb,
                            max_output_bytes=args.max_output_bytes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"sandbox: {exc}") from None
    except SandboxUnavailable as exc:
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"status": result.status, "reason": result.reason, "stdout": result.stdout,
                      "wall_s": result.wall_s, "backend": result.backend}))
    return 0 if result.ok else 1


def cmd_expdis(args: argparse.Namespace) -> int:
    """ExpDis rounds (explore → filter → distil); see docs/methods/expdis.md."""
    from reasonrl.methods.expdis.loop import ExpDisLoop, load_expdis_recipe, saved_recipe

    if args.resume:
        if args.set:
            raise ConfigError("--set cannot change a run being resumed; start a new run instead")
        recipe = saved_recipe(args.output)
    elif not args.recipe:
        raise ConfigError("expdis needs a RECIPE.yaml (or --resume with -o OUT)")
    else:
        recipe = load_expdis_recipe(args.recipe, args.set)
    summary = ExpDisLoop(recipe, args.output, resume=args.resume).run()
    print(json.dumps({k: summary[k] for k in ("out", "final_model", "start_eval", "final_eval", "wall_seconds")}))
    return 0


def cmd_fed_sim(args: argparse.Namespace) -> int:
    """Fed-GRPO / FedAvg in Flower's simulation runtime; see docs/methods/fed_grpo.md."""
    from reasonrl.methods.fed_grpo.client import fed_run_recipe

    recipe = fed_run_recipe(args.recipe, args.set, args.output, args.resume)
    try:
        from reasonrl.methods.fed_grpo.apps import simulate
    except ImportError as exc:
        raise ImportError(f"fed-sim needs Flower: pip install 'reasonrl[fed]' ({exc})") from None
    summary = simulate(recipe, args.output)
    print(json.dumps({k: summary[k] for k in ("run_dir", "rounds", "base_accuracy", "final_accuracy")}))
    return 0


def _tls(args: argparse.Namespace):
    from reasonrl.methods.fed_grpo.deploy import TLS

    files = (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certfile)
    if args.insecure:
        if any(files):
            raise ConfigError("--insecure and --ssl-* files exclude each other")
        return None
    if not all(files):
        raise ConfigError("fed-server needs --insecure (plain HTTP: one machine or a trusted network) or all of "
                          "--ssl-certfile, --ssl-keyfile and --ssl-ca-certfile (TLS)")
    for f in files:
        if not Path(f).is_file():
            raise ConfigError(f"TLS file {f} does not exist")
    return TLS(*files)


def cmd_fed_server(args: argparse.Namespace) -> int:
    """Fed-GRPO / FedAvg with real Flower processes: the SuperLink and the run; see docs/methods/fed_grpo.md."""
    from reasonrl.methods.fed_grpo.client import fed_run_recipe
    from reasonrl.methods.fed_grpo.deploy import serve

    recipe = fed_run_recipe(args.recipe, args.set, args.output, args.resume)
    summary = serve(recipe, args.output, host=args.host, port=args.port, tls=_tls(args))
    print(json.dumps({k: summary[k] for k in ("run_dir", "rounds", "base_accuracy", "final_accuracy")}))
    return 0


def cmd_fed_client(args: argparse.Namespace) -> int:
    """One Fed-GRPO client as a Flower SuperNode; serves until stopped."""
    from reasonrl.methods.fed_grpo.deploy import join

    if args.insecure == bool(args.root_certificates):
        raise ConfigError("fed-client needs exactly one of --insecure (plain HTTP) and --root-certificates PEM (TLS)")
    # Under the runs folder, as a training run's output is, never loose in the working directory.
    state_dir = args.state_dir or str(Path("runs") / f"fed_client_{args.client}")
    try:
        return join(args.client, args.superlink, state_dir, port=args.port, root_certificates=args.root_certificates)
    except KeyboardInterrupt:  # the way a client is stopped; its state folder keeps the last round
        print(f"reasonrl: client {args.client} stopped", file=sys.stderr)
        return 0


def cmd_fuse(args: argparse.Namespace) -> int:
    """SURGE: fuse two checkpoints of one run; see docs/methods/surge.md."""
    from reasonrl.methods.surge.fuse import FuseSettings, fuse

    settings = FuseSettings.validated(retain=args.retain, gamma=args.gamma, beta_res=args.beta_res,
                                      projection=args.projection, embeddings=args.embeddings,
                                      control=args.control, seed=args.seed)
    info = fuse(args.anchor, args.donor, args.base, args.output, settings, overwrite=args.overwrite)
    print(json.dumps({"output": args.output, **info["summary"]}))
    return 0


def package_version() -> str:
    """The installed distribution's version, or the source tree's ``reasonrl.__version__``."""
    try:
        return version("reasonrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return getattr(reasonrl, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reasonrl", description=__doc__.splitlines()[0],
        epilog="reasonrl COMMAND --help shows a command's options; reasonrl list shows every component a recipe can name.")
    parser.add_argument("--version", action="version", version=f"reasonrl {package_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, **kwargs) -> argparse.ArgumentParser:
        # The one-line help of the command list is also the description of the command's own --help.
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", **kwargs)

    train = command("train", "run a recipe: sample, score, update, checkpoint, evaluate before and after")
    train.add_argument("recipe", nargs="?", metavar="RECIPE.yaml",
                       help="the recipe file (recipes/ has examples; docs/recipes.md lists every key)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe value, e.g. --set optim.lr=1e-4 (repeatable); with --resume only "
                            "train.steps, to run a stopped or finished run further")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint, "
                       "with the recipe it saved (recipe.json)")
    train.add_argument("-o", "--output", metavar="RUN_DIR", help="run folder (default: output_dir/<recipe>-<time>)")
    train.add_argument("--nproc", type=int, metavar="N",
                       help="learner ranks (FSDP2; overrides train.nproc): N processes under torchrun on this "
                            "machine, or Ray actors with train.engine: ray (docs/scaling.md)")
    train.set_defaults(func=cmd_train)

    ev = command("eval", "sample n completions per problem: avg@k, pass@k, maj@k, greedy, with CIs")
    ev.add_argument("--model", required=True, help="tiny, a run folder, a checkpoint folder, a model folder, a .gguf or an alias")
    ev.add_argument("--task", help="a registered task (reasonrl list tasks), e.g. arithmetic")
    ev.add_argument("--recipe", metavar="RECIPE.yaml",
                    help="take the task and its parameters, the reward (eval.reward), rollout.stop and "
                         "rollout.max_new_tokens from this recipe (its held-out problems); flags given beside it "
                         "win, and --task naming another task takes nothing from it")
    ev.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a parameter of the task, as in a recipe's task: section (repeatable)")
    ev.add_argument("--n", type=int, default=16, help="samples per problem (default 16)")
    ev.add_argument("--k", type=int, default=8, help="report pass@k and maj@k for this k (and 1; default 8)")
    ev.add_argument("--size", type=int, default=100, help="held-out problems (default 100)")
    ev.add_argument("--reward", help="the reward whose 1 means correct (default exact_answer, or the recipe's eval.reward)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    ev.add_argument("--max-new-tokens", type=int, metavar="N",
                    help="tokens per completion at most (default 64, or the recipe's rollout.max_new_tokens)")
    ev.add_argument("--batch-size", type=int, default=128, help="sequences sampled together (default 128)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the problems drawn and of sampling (default 0)")
    ev.add_argument("--baseline-model", metavar="MODEL", help="also evaluate this model (e.g. the base) on the same "
                    "problems: Regret Gap and the reward-hacking flag (docs/diagnostics.md)")
    ev.add_argument("--stop", action="append", default=[], metavar="STR",
                    help="end each completion at STR (\\n for a newline; repeatable), as a recipe's rollout.stop; "
                         "default: the recipe's rollout.stop, else the task's own stop strings")
    ev.add_argument("--prefill", action="append", default=[], metavar="CUE",
                    help="also evaluate with the completion prefilled with CUE (\\n for a newline; repeatable): "
                         "delta pass@1 with a paired CI, log p(CUE), how often the model writes CUE itself")
    ev.add_argument("-o", "--output", default="eval.json", metavar="FILE.json",
                    help="where the results go (default eval.json)")
    ev.set_defaults(func=cmd_eval)

    rep = command("report", "one self-contained HTML file comparing runs (curves, final eval, recipe diff)")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (reasonrl train prints its own)")
    rep.add_argument("-o", "--output", default="report.html", metavar="FILE.html",
                     help="where the report goes (default report.html)")
    rep.add_argument("--title", help="the report's title (default: the runs' names)")
    rep.add_argument("--baseline", metavar="NAME",
                     help="a group name as the report shows it: compare every other group with it (difference, "
                          "bootstrap interval, Welch's t-test); also writes <output stem>_stats.json")
    rep.add_argument("--bootstrap", type=int, default=2000, metavar="B",
                     help="bootstrap resamples for --baseline intervals (default 2000, fixed seed)")
    rep.set_defaults(func=cmd_report)

    quick = command("quickstart", "warm up the embedded model, train it with GRPO, compare")
    quick.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    quick.add_argument("-o", "--output", default="runs/quickstart", metavar="DIR",
                       help="output folder (default runs/quickstart)")
    quick.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a value of the quickstart's recipe, e.g. --set train.steps=50 (repeatable)")
    quick.set_defaults(func=cmd_quickstart)

    lst = command("list", "every component a recipe can name (advantages, losses, rewards, tasks, ...): "
                          "parameters, defaults, a summary, where it is defined")
    lst.add_argument("stage", nargs="?", metavar="STAGE",
                     help="only this stage (e.g. advantages, rewards, or its recipe section: advantage)")
    lst.add_argument("--markdown", action="store_true",
                     help="the Markdown tables of the components reasonrl ships, as in docs/components.md")
    lst.set_defaults(func=cmd_list)

    desc = command("describe", "one component: its whole docstring, a recipe entry with its defaults, "
                               "its parameters' types and bounds")
    desc.add_argument("name", metavar="NAME", help="a component's name, e.g. grpo (every stage that has it is shown)")
    desc.add_argument("--stage", metavar="STAGE", help="only the component of this stage (e.g. selectors)")
    desc.set_defaults(func=cmd_describe)

    box = command("sandbox", "run a Python file in the code sandbox; one JSON line: status, reason, "
                             "stdout, wall_s, backend (exit 0 iff status is ok)")
    box.add_argument("file", metavar="FILE.py", help="the Python file to run, as a reward would run a completion")
    box.add_argument("--timeout", type=float, default=5.0, metavar="S", help="wall-clock seconds (default 5)")
    box.add_argument("--memory-mb", type=int, default=256, metavar="M", help="address-space limit (default 256)")
    box.add_argument("--max-output-bytes", type=int, default=64_000, metavar="N",
                     help="stdout kept, in bytes (default 64000)")
    box.set_defaults(func=cmd_sandbox)

    exd = command("expdis", "ExpDis: rounds of novelty-seeking explorers, filter, SFT of the student")
    exd.add_argument("recipe", nargs="?", help="the explorers' recipe (advantage novelty + method novelty_memory)")
    exd.add_argument("-o", "--output", required=True, help="output folder")
    exd.add_argument("--resume", action="store_true", help="continue the loop in --output where it stopped")
    exd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a recipe value; expdis.<key>=... sets the loop's settings (repeatable)")
    exd.set_defaults(func=cmd_expdis)

    def federation_parser(name: str, help: str, output: str, func) -> argparse.ArgumentParser:
        fed = command(name, help)
        fed.add_argument("recipe", nargs="?", help="a recipe with a fed_grpo entry in methods: (recipes/fed_grpo.yaml)")
        fed.add_argument("--resume", action="store_true", help="continue the federation in --output after its last "
                         "finished round (clients keep their own state)")
        fed.add_argument("-o", "--output", required=True, help=output)
        fed.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a recipe value (repeatable); fed.<key>=... sets a federation setting")
        fed.set_defaults(func=func)
        return fed

    federation_parser("fed-sim", "Fed-GRPO/FedAvg: a federation of the recipe's clients in Flower's simulation",
                      "the server's output folder (clients keep state under it)", cmd_fed_sim)
    fsrv = federation_parser("fed-server", "Fed-GRPO/FedAvg with real Flower processes: start a SuperLink and run "
                             "the federation on the clients that join (reasonrl fed-client)",
                             "the server's output folder", cmd_fed_server)
    fsrv.add_argument("--host", default="127.0.0.1", help="address the SuperLink listens on (0.0.0.0: every interface)")
    fsrv.add_argument("--port", type=int, default=9092, help="the SuperLink's port (clients connect to it)")
    fsrv.add_argument("--insecure", action="store_true", help="plain HTTP, no TLS (one machine or a trusted network)")
    fsrv.add_argument("--ssl-certfile", help="TLS: the SuperLink's certificate (PEM)")
    fsrv.add_argument("--ssl-keyfile", help="TLS: the SuperLink's private key (PEM)")
    fsrv.add_argument("--ssl-ca-certfile", help="TLS: the CA certificate that signed it (PEM)")

    fcli = command("fed-client", "one Fed-GRPO client: a Flower SuperNode that trains on its own prompts "
                                             "for the server at --superlink (until stopped)")
    fcli.add_argument("--client", type=int, required=True, help="this client's index, 0 .. clients-1 (its data split)")
    fcli.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the fed-server's address")
    fcli.add_argument("-o", "--output", "--state-dir", dest="state_dir",
                      help="this client's own folder: optimiser state, residual, logs (default runs/fed_client_C)")
    fcli.add_argument("--port", type=int, help="the SuperNode's local API port (default 9094 + client index)")
    fcli.add_argument("--insecure", action="store_true", help="plain HTTP, no TLS (the server runs --insecure)")
    fcli.add_argument("--root-certificates", metavar="PEM", help="TLS: the CA certificate to verify the server with")
    fcli.set_defaults(func=cmd_fed_client)

    fz = command("fuse", "SURGE: fuse an anchor and a donor checkpoint of one run into an HF folder")
    fz.add_argument("anchor", metavar="ANCHOR", help="a run folder, checkpoint folder, model folder or alias")
    fz.add_argument("donor", metavar="DONOR", help="the checkpoint whose complementary update is added")
    fz.add_argument("--base", required=True, help="the model both were trained from (e.g. tiny)")
    fz.add_argument("--retain", type=float, default=0.9, help="ρ: anchor spectral energy kept per matrix")
    fz.add_argument("--gamma", type=float, default=1.0, help="γ: weight of the donor's complementary component")
    fz.add_argument("--beta-res", type=float, default=0.0, help="β_res: weight of the anchor's residual")
    fz.add_argument("--projection", default="two_sided", help="two_sided or one_sided")
    fz.add_argument("--embeddings", default="svd", help="svd (fuse them) or anchor (copy the anchor's)")
    fz.add_argument("--control", default="none",
                    help="none, random or random_unconstrained: a random direction of C_d's norm instead of C_d")
    fz.add_argument("--seed", type=int, default=0, help="seed of the control's random directions")
    fz.add_argument("-o", "--output", required=True, help="the fused model folder (written atomically)")
    fz.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    fz.set_defaults(func=cmd_fuse)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = 1  # an exception that escapes (its traceback is the report)
    try:
        code = _run(args)
        return code
    finally:
        if os.environ.get("REASONRL_EXIT_FILE"):  # rank 0 under `reasonrl train --nproc N`
            from reasonrl.train.launch import write_exit_status

            write_exit_status(code)


def _run(args: argparse.Namespace) -> int:
    try:
        # Every built-in component, as reasonrl.config would import them; only once a command runs,
        # so --help and --version answer without importing torch (~3 s).
        load_components()
        return args.func(args)
    except (ConfigError, UnknownNameError, FileNotFoundError, ImportError) as exc:
        # ImportError: an optional extra the recipe needs; its message names the pip command.
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
    except CheckpointWriteError as exc:  # the run's environment failed, not its input: exit 1
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"reasonrl: interrupted{_interrupted(args)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
