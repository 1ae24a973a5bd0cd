"""``benchmarks/logra_memory.py --repeats``: every arm measured R times in fresh processes, the arms
interleaved in a rotated order, and the table of medians with the changes against AdamW and LoRA."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("logra_memory", ROOT / "benchmarks" / "logra_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PEAKS = {"adamw": [150.0, 146.0, 160.0], "lora": [210.0, 161.0, 200.0], "logra": [133.0, 140.0, 120.0]}


def test_medians_and_changes_by_hand():
    bench = _bench()
    results = [{"arm": arm, "peak_mib": p, "trainable_params": 7} for arm, peaks in PEAKS.items() for p in peaks]
    s = bench.summarise(results, ["adamw", "lora", "logra"])
    assert [s[a]["median_mib"] for a in ("adamw", "lora", "logra")] == [150.0, 200.0, 133.0]
    assert (s["lora"]["min_mib"], s["lora"]["max_mib"]) == (161.0, 210.0)
    # 133/150 − 1 = −11.3%, 133/200 − 1 = −33.5%, 200/150 − 1 = +33.3%
    assert s["logra"]["vs_adamw_pct"] == -11.3 and s["logra"]["vs_lora_pct"] == -33.5
    assert s["lora"]["vs_adamw_pct"] == 33.3 and "vs_adamw_pct" not in s["adamw"]


def test_repeats_run_every_arm_in_fresh_processes_in_rotated_order(tmp_path, monkeypatch, capsys):
    bench = _bench()
    calls = []
    served = {arm: iter(peaks) for arm, peaks in PEAKS.items()}

    def fake_run(cmd, capture_output, text, check):
        arm = cmd[cmd.index("--one") + 1]
        calls.append(arm)
        assert cmd[0] == sys.executable and "--repeats" not in cmd  # one measurement per process
        line = json.dumps({"arm": arm, "peak_mib": next(served[arm]), "trainable_params": 1})
        return subprocess.CompletedProcess(cmd, 0, stdout="log line\n" + line + "\n", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    out = tmp_path / "memory.json"
    assert bench.main(["--repeats", "3", "--out", str(out)]) == 0
    assert calls == ["adamw", "lora", "logra", "lora", "logra", "adamw", "logra", "adamw", "lora"]
    saved = json.loads(out.read_text())
    assert saved["settings"]["repeats"] == 3 and len(saved["measurements"]) == 9
    assert saved["summary"]["logra"]["median_mib"] == 133.0 and saved["summary"]["logra"]["vs_adamw_pct"] == -11.3
    printed = capsys.readouterr().out
    assert "median of 3" in printed and "-11.3%" in printed
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
