"""The report's completions browser: what each run's ``samples.jsonl`` (and ``reasonrl eval``'s
``eval.json``) puts in the page, what is left out and said so, and, where a headless Chromium is
installed, the page's own script run in it: curves drawn, the browser's rows shown, two runs side
by side, no script error, and its number format equal to the Python one.

Run folders and sample rows are written by hand, in the format ``reasonrl.train.samples`` writes.
"""

import html
import json
import re
import shutil
import subprocess

import pytest

from reasonrl.evaluate.browser import MAX_ROWS_PER_VIEW, MAX_VIEWS_PER_SPLIT
from reasonrl.evaluate.page_assets import JS
from reasonrl.evaluate.report import write_report
from reasonrl.evaluate.runs import number_text

PROMPTS = ["3+4;", "2*(5+1);", "9-2*3;"]
ANSWERS = ["7", "12", "3"]


def _sample(step, split, i, completion, correct, **extra):
    row = {"step": step, "split": split, "prompt": PROMPTS[i], "completion": completion, "answer": ANSWERS[i],
           "rewards": {"exact_answer": float(correct), "format": 1.0} if split == "train" else {},
           "reward": float(correct) + (1.0 if split == "train" else 0.0), "advantage": 0.5 if correct else -0.5,
           "length": len(completion), "stop_reason": "eos", "correct": correct, "group": i}
    return {**row, **extra}


def _run(root, name, seed, samples=None, lines=None, evals=None):
    path = root / name
    path.mkdir(parents=True)
    (path / "recipe.json").write_text(json.dumps({"run_name": None, "train": {"seed": seed, "steps": 2}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.2 * s, "reward/exact_answer": 0.1 * s})
                                                + "\n" for s in (1, 2)))
    (path / "summary.json").write_text(json.dumps({"final_eval": {"accuracy": 0.5}, "wall_seconds": 1.0}))
    if samples is not None or lines is not None:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in samples or []) + "".join(lines or [])
        (path / "samples.jsonl").write_text(text)
    if evals is not None:
        (path / "eval.json").write_text(json.dumps(evals))
    return path


def _two_runs(root):
    """Run a (seed 0): train rows at steps 1 and 2, eval rows at step 2 and the final one; run b (seed 1):
    the same evaluations, other answers on them."""
    a = [_sample(1, "train", 0, "3+4=7;####7", True), _sample(1, "train", 0, "3+4=8;####8", False),
         _sample(2, "train", 1, "5+1=6;2*6=12;####12", True),
         *[_sample(2, "eval", i, f"a{i}: ####{ANSWERS[i]}", True) for i in range(3)],
         *[_sample(2, "eval", i, f"a-final{i}: ####{ANSWERS[i] if i else 0}", i > 0, final=True) for i in range(3)]]
    b = [*[_sample(2, "eval", i, f"b{i}: ####{i}", False) for i in range(3)],
         *[_sample(2, "eval", i, f"b-final{i}: ####{ANSWERS[i]}", True, final=True) for i in range(3)]]
    return _run(root, "grpo-s0", 0, a), _run(root, "grpo-s1", 1, b)


def _data(page):
    found = re.search(r"<script type='application/json' id='rrl-data'>(.*?)</script>", page, re.S)
    return json.loads(found.group(1))


def _views(data, run):
    (entry,) = [e for e in data["samples"]["runs"] if e["run"] == run]
    return entry


def test_each_run_and_step_of_samples_is_in_the_page(tmp_path):
    a, b = _two_runs(tmp_path)
    page = write_report([a, b], tmp_path / "r.html").read_text()
    data = _data(page)
    samples, strings = data["samples"], data["samples"]["strings"]
    run_a, run_b = _views(data, 0), _views(data, 1)
    assert [v["key"] for v in run_a["views"]] == ["train:1", "train:2", "eval:2", "eval:2:final"]
    assert [v["label"] for v in run_a["views"]] == ["step 1 · train", "step 2 · train", "step 2 · eval", "final eval (step 2)"]
    assert [v["key"] for v in run_b["views"]] == ["eval:2", "eval:2:final"]
    # each opens on its final evaluation, where every run answered the same prompts
    assert run_a["views"][run_a["initial"]]["key"] == run_b["views"][run_b["initial"]]["key"] == "eval:2:final"
    # a row as written, its prompt and answer by index into the shared strings
    right, wrong = run_a["views"][0]["rows"]
    assert (strings[right["p"]], right["c"], strings[right["a"]]) == ("3+4;", "3+4=7;####7", "7")
    assert (right["r"], right["t"], right["v"], right["n"], right["s"], right["k"], right["g"]) == (
        2.0, {"exact_answer": 1.0, "format": 1.0}, 0.5, 11, "eos", True, 0)
    assert wrong["k"] is False and wrong["c"] == "3+4=8;####8"
    # the same prompt in two runs is the same string: what the compare view matches on
    finals = [{strings[r["p"]]: r for r in _views(data, run)["views"][-1]["rows"]} for run in (0, 1)]
    assert set(finals[0]) == set(finals[1]) == set(PROMPTS)
    assert (finals[0]["3+4;"]["c"], finals[1]["3+4;"]["c"]) == ("a-final0: ####0", "b-final0: ####7")
    assert len(strings) == len(set(strings)) == 6  # 3 prompts and 3 answers, each once
    assert samples["notes"] == [] and samples["caps"] == {"rows_per_view": MAX_ROWS_PER_VIEW,
                                                          "views_per_split": MAX_VIEWS_PER_SPLIT}
    assert "<div id='rrl-browser'></div>" in page and "<a href='#samples'>Completions</a>" in page


def test_a_run_without_samples_gets_no_browser(tmp_path, capsys):
    a, _ = _two_runs(tmp_path)
    plain = _run(tmp_path, "plain", 2)
    page = write_report([plain], tmp_path / "plain.html", warn=print).read_text()
    assert _data(page)["samples"] is None and "<div id='rrl-browser'>" not in page
    assert capsys.readouterr().out == ""  # no samples is no warning
    # beside a run with samples, it is simply not in the browser
    data = _data(write_report([plain, a], tmp_path / "both.html").read_text())
    assert [e["run"] for e in data["samples"]["runs"]] == [1]


def test_what_the_page_cannot_hold_is_left_out_and_said(tmp_path):
    many_rows = [_sample(1, "train", i % 3, f"c{i}", i % 2 == 0) for i in range(MAX_ROWS_PER_VIEW + 36)]
    many_steps = [_sample(s, "train", 0, f"s{s}", True) for s in range(2, 2 + MAX_VIEWS_PER_SPLIT + 20)]
    path = _run(tmp_path, "long", 0, many_rows + many_steps, lines=['{"step": 99, "spl\n', "not json\n", "\n"])
    data = _data(write_report([path], tmp_path / "r.html").read_text())
    views = _views(data, 0)["views"]
    assert len(views) == MAX_VIEWS_PER_SPLIT
    steps = [v["step"] for v in views]
    assert steps[0] == 1 and steps[-1] == 1 + MAX_VIEWS_PER_SPLIT + 20 and steps == sorted(steps)  # evenly, both ends
    first = views[0]
    assert first["total"] == MAX_ROWS_PER_VIEW + 36 and len(first["rows"]) == MAX_ROWS_PER_VIEW
    assert [r["c"] for r in first["rows"]] == [f"c{i}" for i in range(MAX_ROWS_PER_VIEW)]  # the first ones, in order
    notes = data["samples"]["notes"]
    assert "long: 2 unreadable line(s) of samples.jsonl skipped" in notes
    assert f"long: {MAX_VIEWS_PER_SPLIT + 21} train steps have samples; {MAX_VIEWS_PER_SPLIT} of them, evenly spaced, are in this page" in notes
    assert f"long: at most {MAX_ROWS_PER_VIEW} rows of a step are in this page" in notes


def test_eval_json_completions_are_a_view(tmp_path):
    problems = [{"prompt": PROMPTS[i], "answer": ANSWERS[i], "n": 2, "correct": 1, "sample_correct": [True, False],
                 "completions": [f"####{ANSWERS[i]}", "####0"], "greedy_completion": f"####{ANSWERS[i]}", "greedy": True}
                for i in range(3)]
    evals = {"arithmetic": {"num_problems": 3, "n": 2, "metrics": {"avg@2": 0.5}, "per_problem": problems}}
    path = _run(tmp_path, "evaluated", 0, evals=evals)
    data = _data(write_report([path], tmp_path / "r.html").read_text())
    (view,) = _views(data, 0)["views"]
    assert (view["key"], view["label"], view["total"]) == ("evaljson:arithmetic", "reasonrl eval · arithmetic", 9)
    rows = view["rows"]
    assert [(r["c"], r["k"], r["r"], r.get("x")) for r in rows[:3]] == [
        ("####7", True, 1.0, None), ("####0", False, 0.0, None), ("####7", True, 1.0, "greedy")]
    assert [r["g"] for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_the_file_name_is_the_trainers():
    from reasonrl.evaluate import browser
    from reasonrl.train import samples

    assert browser.SAMPLES_FILE == samples.SAMPLES_FILE  # written there, read here (evaluate does not import train)


def test_a_completion_cannot_end_the_page_script(tmp_path):
    evil = "</script><script>document.title='owned'</script><!-- & \u2028"
    path = _run(tmp_path, "evil", 0, [_sample(1, "train", 0, evil, True)])
    page = write_report([path], tmp_path / "r.html").read_text()
    assert "<script>document.title" not in page
    assert _views(_data(page), 0)["views"][0]["rows"][0]["c"] == evil


# --- the page in a headless browser ------------------------------------------------------------------


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless Chromium installed (Debian: apt-get install chromium); the page's script is not run")


def _render(browser, url, profile):
    """The DOM after the page's script ran, and the browser's log (console messages, uncaught errors)."""
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def _between(dom, start, end):
    """The part of the DOM from ``start`` to ``end``: one section, without the page's data."""
    return dom[dom.index(start):dom.index(end)]


def _root_attributes(dom):
    """The attributes of <html>: where the page's script says it finished (data-rrl-ready) or failed (data-rrl-errors)."""
    return re.search(r"<html([^>]*)>", dom).group(1)


def _console_errors(log):
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_the_page_runs_in_a_headless_browser(tmp_path):
    browser = _chromium()
    a, b = _two_runs(tmp_path)
    out = write_report([a, b], tmp_path / "r.html")
    dom, log = _render(browser, out.as_uri(), tmp_path / "profile")
    assert 'data-rrl-ready="1"' in _root_attributes(dom) and "data-rrl-errors" not in _root_attributes(dom)
    assert _console_errors(log) == []
    # the curves: one figure per panel with an SVG line per run
    plots = _between(dom, 'id="rrl-plots"', 'id="samples"')
    assert plots.count("<figure") == len(_data(out.read_text())["panels"]) >= 2
    assert len(re.findall(r'<path d="M[^"]+" [^>]*data-run="1"', plots)) >= 2
    assert dom.count('<button type="button" data-run=') == 2  # the legend's toggles
    # the browser opens on run a's final evaluation: three rows, one right and two wrong
    samples = _between(dom, 'id="rrl-samples"', 'id="recipes"')
    assert samples.count('<tr class="ok">') == 2 and samples.count('<tr class="bad">') == 1
    assert "a-final1: ####12" in samples and "b-final" not in samples
    assert "3 of 3 rows at final eval (step 2)" in dom

    # a link into a state: run a's wrong rows of the final evaluation beside run b's
    dom, log = _render(browser, out.as_uri() + "#samples&run=0&compare=1&show=bad", tmp_path / "profile")
    assert "data-rrl-errors" not in _root_attributes(dom) and _console_errors(log) == []
    compared = _between(dom, 'id="rrl-samples"', 'id="recipes"')
    assert '<table class="cmp">' in compared and "1 prompts side by side" in dom
    assert html.escape("a-final0: ####0") in compared and html.escape("b-final0: ####7") in compared
    assert "a-final1" not in compared  # right in run a: filtered out


def test_the_page_formats_numbers_as_the_tables_do(tmp_path):
    browser = _chromium()
    values = [3e-4, 1e-4, -2.5e-5, 0.001, 0.00099999, 0.0707107, 0.55, 0.1 + 0.2, 12.345, 1.234, 400.0, 1234.6,
              999999.0, 1e6, 1.5e7, -0.053, 0.0, 7, 123456.0, 0.0010617]
    page = tmp_path / "fmt.html"
    page.write_text("<!DOCTYPE html><html><body><script type='application/json' id='rrl-data'>"
                    '{"runs":[],"panels":[],"maxStep":null,"samples":null}</script>'
                    f"<script>{JS}</script><script>document.body.setAttribute('data-out', "
                    f"JSON.stringify({json.dumps(values)}.map(window.rrlFormat)));</script></body></html>")
    dom, log = _render(browser, page.as_uri(), tmp_path / "profile")
    assert _console_errors(log) == []
    shown = json.loads(html.unescape(re.search(r'data-out="([^"]*)"', dom).group(1)))
    assert shown == [number_text(v) for v in values]


# Appended to a report: hover, drag and double-click the first plot, click the first run in the legend.
_INTERACT = """<script>(function () {
  var out = {}, fig = document.querySelector("#rrl-plots figure"), svg = fig.querySelector("svg");
  var r = svg.getBoundingClientRect();
  function ev(type, fx) {
    svg.dispatchEvent(new MouseEvent(type, {bubbles: true, button: 0, clientX: r.left + r.width * fx, clientY: r.top + r.height / 2}));
  }
  ev("mousemove", 0.5);
  var tip = fig.querySelector(".rrl-tip");
  out.tip = tip.style.display === "block" ? tip.textContent : "";
  ev("mousedown", 0.3); ev("mousemove", 0.7); ev("mouseup", 0.7);
  out.zoomed = svg.textContent.indexOf("zoomed") >= 0 && !document.getElementById("rrl-reset").disabled;
  ev("dblclick", 0.5);
  out.reset = svg.textContent.indexOf("zoomed") < 0;
  var before = svg.querySelectorAll('path[data-run="0"]').length;
  document.querySelector('#rrl-legend button[data-run="0"]').click();
  out.paths = [before, svg.querySelectorAll('path[data-run="0"]').length, svg.querySelectorAll('path[data-run="1"]').length];
  document.body.setAttribute("data-test", JSON.stringify(out));
})();</script>"""


def test_the_plots_answer_hover_zoom_and_the_legend(tmp_path):
    browser = _chromium()
    a, b = _two_runs(tmp_path)
    page = write_report([a, b], tmp_path / "r.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", _INTERACT + "</body>"))
    dom, log = _render(browser, probe.as_uri(), tmp_path / "profile")
    assert "data-rrl-errors" not in _root_attributes(dom) and _console_errors(log) == []
    seen = json.loads(html.unescape(re.search(r'data-test="([^"]*)"', dom).group(1)))
    # the first panel is the reward: 0.2 and 0.4 at steps 1 and 2 in both runs; the middle of the plot is step 1
    assert seen["tip"] == "step 1■ grpo-s0: 0.2■ grpo-s1: 0.2"
    assert seen["zoomed"] and seen["reset"]
    assert seen["paths"][0] >= 1 and seen["paths"][1] == 0 and seen["paths"][2] >= 1  # run 0 hidden, run 1 still drawn
