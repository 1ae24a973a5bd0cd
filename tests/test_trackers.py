"""``log.report_to``: log a short run, read the scalars back through each tool's own
reader, and compare with ``metrics.jsonl`` (no mocks)."""

import glob
import json
import math
import struct

import pytest

from reasonrl.metrics_log import read_metrics
from reasonrl.train.trackers import mlflow_metric_name
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe


def _jsonl_series(run_dir, key):
    return [(r["step"], r[key]) for r in read_metrics(run_dir) if isinstance(r.get(key), (int, float))]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        recipe = mini_recipe(log={"report_to": ["tensorboard", "mlflow", "wandb"], "experiment": "trackers-test",
                                  "plots": False, "progress": False}, eval={"size": 8, "every": 2})
        run = root / "run"
        Trainer(recipe, run, log=lambda _: None).run()
    return run


KEYS = ["reward/mean", "loss", "entropy", "eval/accuracy", "perf/step_s"]


def keys(run_dir):
    """KEYS plus one per-form accuracy, whose name ('eval/accuracy[a+b*c]') MLflow does not allow as is."""
    per_form = sorted(k for r in read_metrics(run_dir) for k in r if k.startswith("eval/accuracy["))
    return KEYS + per_form[:1]


def test_tensorboard_event_files_hold_the_same_scalars(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked_run / "tensorboard"))
    acc.Reload()
    for key in keys(tracked_run):
        read = [(e.step, e.value) for e in acc.Scalars(key)]
        expected = _jsonl_series(tracked_run, key)
        assert [s for s, _ in read] == [s for s, _ in expected], key
        # event files store float32
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for (_, a), (_, b) in zip(read, expected)), key


def test_mlflow_store_holds_the_same_scalars_and_the_recipe(tracked_run):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tracked_run.parent / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = json.loads((tracked_run / "trackers.json").read_text())["mlflow"]
    run = client.get_run(run_id)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "trackers-test"
    assert run.data.params["optim.lr"] == str(json.loads((tracked_run / "recipe.json").read_text())["optim"]["lr"])
    for key in keys(tracked_run):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, mlflow_metric_name(key)))
        expected = _jsonl_series(tracked_run, key)
        assert [s for s, _ in history] == [s for s, _ in expected], key
        assert [v for _, v in history] == pytest.approx([v for _, v in expected]), key


def read_wandb_history(path):
    """History rows of a wandb offline ``.wandb`` file: a LevelDB-style log of 32 KiB
    blocks whose records (7-byte header: crc32, length, type) hold protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B", "not a wandb data file"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data = raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:  # FULL
            records.append(data)
        elif kind == 2:  # FIRST
            pending = data
        elif kind == 3:  # MIDDLE
            pending += data
        elif kind == 4:  # LAST
            records.append(pending + data)
    rows = []
    for data in records:
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_same_scalars(tracked_run):
    files = glob.glob(str(tracked_run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    history = read_wandb_history(files[0])
    for key in keys(tracked_run):
        read = [(row["_step"], row[key]) for row in history if key in row]
        expected = _jsonl_series(tracked_run, key)
        assert [s for s, _ in read] == [s for s, _ in expected], key
        assert [v for _, v in read] == pytest.approx([v for _, v in expected]), key


def test_missing_extra_fails_before_the_run_folder_exists(tmp_path, monkeypatch, capsys):
    import sys

    from reasonrl.cli import main

    monkeypatch.setitem(sys.modules, "mlflow", None)  # makes `import mlflow` raise ImportError
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {backend: tiny, tiny: {hidden_size: 16, num_layers: 1, num_heads: 1, "
                      "intermediate_size: 16, warmup_steps: 1}}\nlog: {report_to: [mlflow]}\n")
    code = main(["train", str(recipe), "-o", str(tmp_path / "run")])
    assert code == 2 and "pip install 'reasonrl[mlflow]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _sample_rows(run_dir, split):
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return [r for r in rows if r["split"] == split]


def test_trackers_receive_the_completions_of_samples_jsonl(tracked_run):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train = _sample_rows(tracked_run, "train")
    steps = sorted({r["step"] for r in train})
    assert steps == [1, 2, 3, 4]
    # TensorBoard: one text summary per step, a Markdown table holding each completion
    acc = EventAccumulator(str(tracked_run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("samples/train/text_summary")}
    assert sorted(texts) == steps
    for r in train:
        completion = r["completion"].replace("|", "\\|").replace("\n", "⏎")
        assert completion in texts[r["step"]]
    # MLflow: one JSONL artifact per step and split, the very rows of samples.jsonl
    client = MlflowClient(f"sqlite:///{tracked_run.parent / 'mlflow.db'}")
    run_id = json.loads((tracked_run / "trackers.json").read_text())["mlflow"]
    names = sorted(a.path for a in client.list_artifacts(run_id, "samples"))
    assert [n for n in names if "/train_" in n] == [f"samples/train_step_{s:06d}.jsonl" for s in steps]
    # stored beside the SQLite store, not in ./mlruns of the working directory (MLflow's default)
    stored = list((tracked_run.parent / "mlartifacts").rglob("train_step_000002.jsonl"))
    assert len(stored) == 1 and client.get_experiment(client.get_run(run_id).info.experiment_id).artifact_location \
        == (tracked_run.parent / "mlartifacts").as_uri()
    assert [json.loads(line) for line in open(stored[0])] == [r for r in train if r["step"] == 2]
    # W&B: a table per step in the run's history
    files = glob.glob(str(tracked_run / "wandb" / "offline-run-*" / "run-*.wandb"))
    tables = {row["_step"]: row for row in read_wandb_history(files[0]) if "samples/train/_type" in row}
    assert sorted(tables) == steps
    assert all(t["samples/train/_type"] == "table-file" for t in tables.values())
    assert [tables[s]["samples/train/nrows"] for s in steps] == [sum(r["step"] == s for r in train) for s in steps]
