"""The style and script of the ``reasonrl report`` page, inlined into it so that the page stays
one file that opens anywhere, offline: no library, no font, no request of any kind.

The script reads the JSON in ``<script id="rrl-data">`` (written by ``evaluate.report``) and
draws: the training curves as SVG (hover for values, drag to zoom every panel to a range of
steps, double-click to reset, click a run or a group in the legend to hide it), and the
completions browser (run, step, correct / wrong, a reward range, a text search, and two runs
side by side on the prompts both were given). Hand-written rather than a plotting library: a
vendored library would be some hundred kilobytes in every report for what is a few lines of
SVG. ``fmt`` is ``evaluate.runs.number_text`` again, so the page's numbers read as its tables do.
Errors of the script are listed on ``<html data-rrl-errors>`` and a finished start sets
``data-rrl-ready``, which a headless browser test reads.
"""

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1400px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.group{background:#eef5ff}.sig{font-weight:bold;color:#0a6}tr.changed td{background:#fff3c4}
.warn{background:#fff4e5;border:1px solid #f0a040;padding:.6em 1em;border-radius:4px}
.verdict{background:#eef5ff;border:1px solid #7aa7e0;padding:.6em 1em;border-radius:4px;font-size:1.05em}
.verdict p{margin:.2em 0}.better{color:#0a6;font-weight:bold}.worse{color:#c33;font-weight:bold}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:1em}
.grid figure{margin:0;position:relative;border:1px solid #eee}
small{color:#666}details{margin:.4em 0}code{font-size:.95em}
.rrl-svg{width:100%;height:auto;display:block;user-select:none;cursor:crosshair}
.rrl-tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.96);border:1px solid #999;border-radius:3px;
 padding:.3em .5em;font-size:.8em;white-space:nowrap;display:none;z-index:2;box-shadow:0 1px 4px rgba(0,0,0,.15)}
#rrl-legend{display:flex;flex-wrap:wrap;gap:.3em .8em;align-items:center;margin:.6em 0}
#rrl-legend button{font:inherit;font-size:.85em;border:1px solid #ccc;background:#fff;border-radius:3px;padding:.15em .5em;cursor:pointer}
#rrl-legend button.off{opacity:.35;text-decoration:line-through}#rrl-legend .rrl-groupname{font-weight:bold}
#rrl-browser .controls{display:flex;flex-wrap:wrap;gap:.5em 1.2em;align-items:center;margin:.5em 0}
#rrl-browser label{font-size:.9em}#rrl-browser input[type=number]{width:5em}
#rrl-browser pre{white-space:pre-wrap;word-break:break-word;margin:0;max-width:60em;
 font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:.95em}
#rrl-browser tr.ok td:first-child{border-left:4px solid #0a6}#rrl-browser tr.bad td:first-child{border-left:4px solid #c33}
#rrl-browser .cmp td{width:40%}#rrl-browser .sample{border-top:1px dashed #ccc;padding:.3em 0}
#rrl-browser .sample:first-child{border-top:none}.mark-ok{color:#0a6}.mark-bad{color:#c33}
"""

JS = r"""
(function () {
  "use strict";
  var root = document.documentElement, errors = [];
  window.addEventListener("error", function (e) {
    errors.push(String(e.message || e));
    root.setAttribute("data-rrl-errors", errors.join(" | "));
  });
  var DATA = JSON.parse(document.getElementById("rrl-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";  // the SVG namespace's name; nothing is fetched from it

  // evaluate.runs.number_text: integers as integers, scientific below 1e-3 and from 1e6, else 3 significant digits
  function fmt(x) {
    if (x === null || x === undefined) return "—";
    if (typeof x !== "number") return String(x);
    if (isNaN(x)) return "nan";
    if (!isFinite(x)) return x > 0 ? "inf" : "-inf";
    if (x === 0) return "0";
    var a = Math.abs(x), t;
    if (a < 1e-3 || a >= 1e6) {
      var parts = x.toExponential(2).split("e");
      var m = parts[0].indexOf(".") >= 0 ? parts[0].replace(/0+$/, "").replace(/\.$/, "") : parts[0];
      return m + "e" + parseInt(parts[1], 10);
    }
    if (x === Math.round(x)) return String(x);
    t = x.toFixed(Math.max(0, 2 - Math.floor(Math.log10(a))));
    if (t.indexOf(".") >= 0) t = t.replace(/0+$/, "").replace(/\.$/, "");
    return t === "-0" ? "0" : t;
  }
  window.rrlFormat = fmt;  // for a test that compares it with the Python format

  function svg(tag, attrs, parent) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function node(tag, attrs, text, parent) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  // ---- training curves ---------------------------------------------------------------------
  var W = 600, H = 300, M = {l: 58, r: 14, t: 26, b: 36};
  var hidden = {}, zoom = null, plots = [];

  function ticks(lo, hi, n) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10(span / n))), err = span / n / step;
    if (err >= 7.5) step *= 10; else if (err >= 3.5) step *= 5; else if (err >= 1.5) step *= 2;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }

  function nearest(xs, x) {  // index of the point of xs (ascending) closest to x
    var lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  function Plot(panel, index, figure) {
    this.panel = panel; this.index = index; this.figure = figure;
    this.svg = svg("svg", {viewBox: "0 0 " + W + " " + H, "class": "rrl-svg", role: "img", "aria-label": panel.title});
    figure.insertBefore(this.svg, figure.firstChild);
    this.tip = node("div", {"class": "rrl-tip"}, null, figure);
    var self = this;
    this.svg.addEventListener("mousedown", function (e) {
      if (e.button !== 0 || !self.scale) return;
      self.dragFrom = self.local(e).x; e.preventDefault();
    });
    this.svg.addEventListener("mousemove", function (e) { self.move(e); });
    this.svg.addEventListener("mouseup", function (e) { self.release(e); });
    this.svg.addEventListener("mouseleave", function () { self.dragFrom = null; self.hideHover(); });
    this.svg.addEventListener("dblclick", function () { setZoom(null); });
  }

  Plot.prototype.local = function (e) {
    var r = this.svg.getBoundingClientRect();
    return {x: (e.clientX - r.left) * W / r.width, y: (e.clientY - r.top) * H / r.height};
  };

  Plot.prototype.visible = function () {
    return this.panel.series.filter(function (s) { return !hidden[s.run]; });
  };

  Plot.prototype.draw = function () {
    var g = this.svg, panel = this.panel;
    while (g.firstChild) g.removeChild(g.firstChild);
    svg("text", {x: W / 2, y: 16, "text-anchor": "middle", "font-size": 13}, g).textContent = panel.title;
    var all = panel.series, xd;
    if (zoom) xd = zoom;
    else {
      var lo = Infinity, hi = -Infinity;
      all.forEach(function (s) { lo = Math.min(lo, s.x[0]); hi = Math.max(hi, s.x[s.x.length - 1]); });
      xd = [Math.min(0, lo), Math.max(hi, DATA.maxStep || hi)];
      if (xd[0] === xd[1]) xd = [xd[0] - 1, xd[1] + 1];
    }
    var vis = this.visible(), ylo = Infinity, yhi = -Infinity;
    vis.forEach(function (s) {
      for (var i = 0; i < s.x.length; i++) {
        if (s.x[i] < xd[0] || s.x[i] > xd[1]) continue;
        ylo = Math.min(ylo, s.y[i]); yhi = Math.max(yhi, s.y[i]);
      }
    });
    this.scale = null;
    if (ylo === Infinity) {
      svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#888", "font-size": 12}, g).textContent =
        vis.length ? "no point in this range of steps" : "every run of this panel is hidden";
      return;
    }
    var pad = ylo === yhi ? (Math.abs(ylo) * 0.1 || 1) : (yhi - ylo) * 0.05;
    ylo -= pad; yhi += pad;
    var x0 = M.l, x1 = W - M.r, y0 = H - M.b, y1 = M.t;
    var sx = function (x) { return x0 + (x - xd[0]) / (xd[1] - xd[0]) * (x1 - x0); };
    var sy = function (y) { return y0 - (y - ylo) / (yhi - ylo) * (y0 - y1); };
    this.scale = {xd: xd, sx: sx, sy: sy, x0: x0, x1: x1, y0: y0, y1: y1};
    ticks(xd[0], xd[1], 6).forEach(function (v) {
      svg("line", {x1: sx(v), x2: sx(v), y1: y1, y2: y0, stroke: "#eee"}, g);
      svg("text", {x: sx(v), y: y0 + 14, "text-anchor": "middle", "font-size": 10, fill: "#555"}, g).textContent = fmt(v);
    });
    ticks(ylo, yhi, 5).forEach(function (v) {
      svg("line", {x1: x0, x2: x1, y1: sy(v), y2: sy(v), stroke: "#eee"}, g);
      svg("text", {x: x0 - 4, y: sy(v) + 3, "text-anchor": "end", "font-size": 10, fill: "#555"}, g).textContent = fmt(v);
    });
    svg("rect", {x: x0, y: y1, width: x1 - x0, height: y0 - y1, fill: "none", stroke: "#bbb"}, g);
    svg("text", {x: (x0 + x1) / 2, y: H - 6, "text-anchor": "middle", "font-size": 11, fill: "#555"}, g).textContent =
      zoom ? "step (zoomed: double-click to reset)" : "step";
    var clip = "rrl-clip-" + this.index, defs = svg("defs", {}, g);
    svg("rect", {x: x0, y: y1, width: x1 - x0, height: y0 - y1}, svg("clipPath", {id: clip}, defs));
    var lines = svg("g", {"clip-path": "url(#" + clip + ")"}, g);
    vis.forEach(function (s) {
      var run = DATA.runs[s.run];
      var path = function (ys) {
        var d = "";
        for (var i = 0; i < s.x.length; i++) d += (i ? "L" : "M") + sx(s.x[i]).toFixed(1) + " " + sy(ys[i]).toFixed(1);
        return d;
      };
      var style = {fill: "none", stroke: run.color, "stroke-dasharray": run.dash, "data-run": s.run};
      if (s.s) {
        svg("path", Object.assign({d: path(s.y), "stroke-width": 0.8, "stroke-opacity": 0.3}, style), lines);
        svg("path", Object.assign({d: path(s.s), "stroke-width": 1.8}, style), lines);
      } else {
        svg("path", Object.assign({d: path(s.y), "stroke-width": 1.6}, style), lines);
        for (var i = 0; i < s.x.length; i++) svg("circle", {cx: sx(s.x[i]), cy: sy(s.y[i]), r: 2.2, fill: run.color}, lines);
      }
    });
    this.hover = svg("g", {display: "none"}, g);
    this.band = svg("rect", {y: y1, height: y0 - y1, fill: "#4a7bd0", "fill-opacity": 0.15, display: "none"}, g);
  };

  Plot.prototype.toStep = function (px) {
    var c = this.scale;
    return c.xd[0] + (Math.min(Math.max(px, c.x0), c.x1) - c.x0) / (c.x1 - c.x0) * (c.xd[1] - c.xd[0]);
  };

  Plot.prototype.move = function (e) {
    if (!this.scale) return;
    var p = this.local(e), c = this.scale;
    if (this.dragFrom !== null && this.dragFrom !== undefined) {
      var a = Math.max(Math.min(this.dragFrom, p.x), c.x0), b = Math.min(Math.max(this.dragFrom, p.x), c.x1);
      this.band.setAttribute("x", a); this.band.setAttribute("width", Math.max(b - a, 0));
      this.band.setAttribute("display", "inline");
      return;
    }
    var step = this.toStep(p.x), best = null, vis = this.visible();
    vis.forEach(function (s) {
      var x = s.x[nearest(s.x, step)];
      if (best === null || Math.abs(x - step) < Math.abs(best - step)) best = x;
    });
    if (best === null) return;
    var h = this.hover, multiKey = this.panel.keys.length > 1, lines = [];
    while (h.firstChild) h.removeChild(h.firstChild);
    h.setAttribute("display", "inline");
    svg("line", {x1: c.sx(best), x2: c.sx(best), y1: c.y1, y2: c.y0, stroke: "#888", "stroke-dasharray": "3 3"}, h);
    vis.forEach(function (s) {
      var i = nearest(s.x, best);
      if (s.x[i] !== best) return;
      var run = DATA.runs[s.run], y = s.s ? s.s[i] : s.y[i];
      svg("circle", {cx: c.sx(best), cy: c.sy(y), r: 3.5, fill: run.color, stroke: "#fff"}, h);
      lines.push({color: run.color, text: run.label + (multiKey ? " · " + s.key : "") + ": " + fmt(s.y[i]) +
                  (s.s ? "  (average " + fmt(s.s[i]) + ")" : "")});
    });
    var tip = this.tip;
    while (tip.firstChild) tip.removeChild(tip.firstChild);
    node("b", {}, "step " + fmt(best), tip);
    lines.forEach(function (l) {
      var row = node("div", {}, null, tip);
      node("span", {style: "color:" + l.color}, "■ ", row);
      row.appendChild(document.createTextNode(l.text));
    });
    tip.style.display = "block";
    var r = this.svg.getBoundingClientRect(), left = c.sx(best) * r.width / W + 12;
    if (left + tip.offsetWidth > r.width) left = Math.max(0, c.sx(best) * r.width / W - tip.offsetWidth - 12);
    tip.style.left = left + "px"; tip.style.top = (p.y * r.height / H) + "px";
  };

  Plot.prototype.release = function (e) {
    if (this.dragFrom === null || this.dragFrom === undefined || !this.scale) return;
    var p = this.local(e), from = this.dragFrom;
    this.dragFrom = null; this.band.setAttribute("display", "none");
    if (Math.abs(p.x - from) < 5) return;  // a click, not a drag
    var a = this.toStep(Math.min(from, p.x)), b = this.toStep(Math.max(from, p.x));
    if (b > a) setZoom([a, b]);
  };

  Plot.prototype.hideHover = function () {
    if (this.hover) this.hover.setAttribute("display", "none");
    if (this.band) this.band.setAttribute("display", "none");
    this.tip.style.display = "none";
  };

  function redraw() { plots.forEach(function (p) { p.draw(); }); }
  function setZoom(range) {
    zoom = range;
    var reset = document.getElementById("rrl-reset");
    if (reset) reset.disabled = !zoom;
    redraw();
  }

  function legend(box) {
    var groups = [];
    DATA.runs.forEach(function (run, i) {
      var g = groups.filter(function (x) { return x.name === run.group; })[0];
      if (!g) { g = {name: run.group, runs: []}; groups.push(g); }
      g.runs.push(i);
    });
    var buttons = {};
    function refresh() {
      Object.keys(buttons).forEach(function (i) { buttons[i].className = hidden[i] ? "off" : ""; });
      redraw();
    }
    groups.forEach(function (g) {
      if (g.runs.length > 1) {
        var gb = node("button", {type: "button", "class": "rrl-groupname", title: "show or hide every run of this group"},
                      g.name, box);
        gb.addEventListener("click", function () {
          var anyShown = g.runs.some(function (i) { return !hidden[i]; });
          g.runs.forEach(function (i) { hidden[i] = anyShown; });
          refresh();
        });
      }
      g.runs.forEach(function (i) {
        var run = DATA.runs[i];
        var b = node("button", {type: "button", "data-run": i, title: "show or hide " + run.label}, null, box);
        var sw = svg("svg", {width: 26, height: 10, style: "vertical-align:middle;margin-right:.3em"}, b);
        svg("line", {x1: 1, x2: 25, y1: 5, y2: 5, stroke: run.color, "stroke-width": 2.2, "stroke-dasharray": run.dash}, sw);
        b.appendChild(document.createTextNode(run.label));
        b.addEventListener("click", function () { hidden[i] = !hidden[i]; refresh(); });
        buttons[i] = b;
      });
    });
    var reset = node("button", {type: "button", id: "rrl-reset"}, "reset zoom", box);
    reset.disabled = true;
    reset.addEventListener("click", function () { setZoom(null); });
    node("small", {}, "hover a plot for values · drag across it to zoom every plot to those steps · double-click to reset · " +
         "click a run (or a group) to hide it", box);
  }

  function initPlots() {
    var grid = document.getElementById("rrl-plots");
    if (!grid) return;
    legend(document.getElementById("rrl-legend"));
    DATA.panels.forEach(function (panel, i) {
      var fig = node("figure", {"data-panel": panel.name}, null, grid);
      node("figcaption", {}, null, fig).appendChild(node("small", {}, panel.caption));
      var p = new Plot(panel, i, fig);
      plots.push(p);
    });
    redraw();
  }

  // ---- completions browser -----------------------------------------------------------------
  function initBrowser() {
    var S = DATA.samples, box = document.getElementById("rrl-browser");
    if (!S || !box) return;
    var str = function (i) { return i === null || i === undefined ? null : S.strings[i]; };
    var byRun = {};
    S.runs.forEach(function (r) { byRun[r.run] = r; });
    var controls = node("div", {"class": "controls"}, null, box);
    function labelled(text, input) {
      var l = node("label", {}, text + " ", controls);
      l.appendChild(input);
      return input;
    }
    function select(options) {
      var s = node("select");
      options.forEach(function (o) { node("option", {value: o[0]}, o[1], s); });
      return s;
    }
    var runSel = labelled("Run", select(S.runs.map(function (r) { return [r.run, DATA.runs[r.run].label]; })));
    var viewSel = labelled("Step", node("select"));
    var kindSel = labelled("Show", select([["all", "all"], ["ok", "correct"], ["bad", "wrong"], ["none", "not judged"]]));
    var lo = labelled("reward ≥", node("input", {type: "number", step: "any"}));
    var hi = labelled("≤", node("input", {type: "number", step: "any"}));
    var text = labelled("text", node("input", {type: "search", placeholder: "in prompt or completion"}));
    var cmpSel = labelled("Compare with", node("select"));
    var count = node("p", {"class": "count"}, null, box);
    var out = node("div", {id: "rrl-samples"}, null, box);

    function views(run) { return byRun[run] ? byRun[run].views : []; }
    function fillViews(keep) {
      while (viewSel.firstChild) viewSel.removeChild(viewSel.firstChild);
      var vs = views(runSel.value), chosen = null;
      vs.forEach(function (v, i) {
        node("option", {value: i}, v.label, viewSel);
        if (v.key === keep) chosen = i;
      });
      viewSel.value = chosen !== null ? chosen : (byRun[runSel.value] ? byRun[runSel.value].initial : 0);
      while (cmpSel.firstChild) cmpSel.removeChild(cmpSel.firstChild);
      node("option", {value: ""}, "— none —", cmpSel);
      S.runs.forEach(function (r) { if (String(r.run) !== String(runSel.value)) node("option", {value: r.run}, DATA.runs[r.run].label, cmpSel); });
    }
    function passes(row) {
      var k = kindSel.value;
      if (k === "ok" && row.k !== true) return false;
      if (k === "bad" && row.k !== false) return false;
      if (k === "none" && row.k !== null && row.k !== undefined) return false;
      if (lo.value !== "" && !(row.r !== null && row.r >= parseFloat(lo.value))) return false;
      if (hi.value !== "" && !(row.r !== null && row.r <= parseFloat(hi.value))) return false;
      var q = text.value.toLowerCase();
      if (q && (str(row.p) || "").toLowerCase().indexOf(q) < 0 && (row.c || "").toLowerCase().indexOf(q) < 0) return false;
      return true;
    }
    function promptCell(td, p) {
      var full = str(p) || "";
      var d = node("details", {}, null, td);
      node("summary", {}, full.length > 90 ? "…" + full.slice(-90) : full, d);  // the end: the question, after any few-shot examples
      node("pre", {}, full, d);
    }
    function mark(k) { return k === true ? "✓" : k === false ? "✗" : "·"; }
    function terms(t) {
      return Object.keys(t || {}).map(function (k) { return k + " " + fmt(t[k]); }).join(", ");
    }
    function single(view, rows) {
      var table = node("table", {"class": "rows"}, null, out), head = node("tr", {}, null, table);
      ["", "group", "prompt", "completion", "answer", "reward", "terms", "advantage", "length", "stop"].forEach(function (h) {
        node("th", {}, h, head);
      });
      rows.forEach(function (row) {
        var tr = node("tr", {"class": row.k === true ? "ok" : row.k === false ? "bad" : ""}, null, table);
        node("td", {"class": row.k === true ? "mark-ok" : row.k === false ? "mark-bad" : ""}, mark(row.k) + (row.x ? " " + row.x : ""), tr);
        node("td", {}, row.g === null || row.g === undefined ? "" : row.g, tr);
        promptCell(node("td", {}, null, tr), row.p);
        node("pre", {}, row.c, node("td", {}, null, tr));
        node("td", {}, str(row.a), tr);
        node("td", {}, fmt(row.r), tr);
        node("td", {}, terms(row.t), tr);
        node("td", {}, fmt(row.v), tr);
        node("td", {}, fmt(row.n), tr);
        node("td", {}, row.s || "", tr);
      });
    }
    function stack(td, rows) {
      if (!rows.length) { node("small", {}, "(not given this prompt here)", td); return; }
      rows.forEach(function (row) {
        var d = node("div", {"class": "sample"}, null, td);
        var top = node("div", {}, null, d);
        node("b", {"class": row.k === true ? "mark-ok" : row.k === false ? "mark-bad" : ""}, mark(row.k) + " ", top);
        top.appendChild(document.createTextNode("reward " + fmt(row.r) + (row.x ? " · " + row.x : "") +
                                                (row.v !== null && row.v !== undefined ? " · advantage " + fmt(row.v) : "")));
        node("pre", {}, row.c, d);
      });
    }
    function compare(view, rows, other) {
      var vB = views(other).filter(function (v) { return v.key === view.key; })[0];
      var nameA = DATA.runs[runSel.value].label, nameB = DATA.runs[other].label;
      if (!vB) {
        node("p", {}, nameB + " has no samples at " + view.label + "; pick a step both runs have (evaluations give every run the " +
             "same prompts).", out);
        return 0;
      }
      var order = [], seen = {};
      rows.forEach(function (r) { if (!seen[r.p]) { seen[r.p] = true; order.push(r.p); } });
      var shared = order.filter(function (p) { return vB.rows.some(function (r) { return r.p === p; }); });
      if (!shared.length) {
        node("p", {}, "No prompt of these rows of " + nameA + " is among the rows of " + nameB + " at " + view.label +
             ". Training steps draw their own prompts; evaluation steps give every run the same ones.", out);
        return 0;
      }
      var table = node("table", {"class": "cmp"}, null, out), head = node("tr", {}, null, table);
      node("th", {}, "prompt", head); node("th", {}, nameA, head); node("th", {}, nameB, head);
      shared.forEach(function (p) {
        var tr = node("tr", {}, null, table);
        var td = node("td", {}, null, tr);
        promptCell(td, p);
        var answers = rows.filter(function (r) { return r.p === p && r.a !== null && r.a !== undefined; });
        if (answers.length) node("small", {}, "answer: " + str(answers[0].a), td);
        stack(node("td", {}, null, tr), rows.filter(function (r) { return r.p === p; }));
        stack(node("td", {}, null, tr), vB.rows.filter(function (r) { return r.p === p; }));
      });
      return shared.length;
    }
    function render() {
      while (out.firstChild) out.removeChild(out.firstChild);
      var vs = views(runSel.value), view = vs[viewSel.value];
      if (!view) { count.textContent = "no samples in this run"; return; }
      var rows = view.rows.filter(passes);
      var kept = view.total > view.rows.length ? " (" + view.rows.length + " of the " + view.total + " written are kept here)" : "";
      if (cmpSel.value === "") {
        single(view, rows);
        count.textContent = rows.length + " of " + view.rows.length + " rows at " + view.label + kept;
      } else {
        var n = compare(view, rows, cmpSel.value);
        count.textContent = n + " prompts side by side (the filters choose rows of " + DATA.runs[runSel.value].label + ")" + kept;
      }
    }
    runSel.addEventListener("change", function () {
      var v = views(runSel.value)[viewSel.value];
      fillViews(v ? v.key : null); render();
    });
    [viewSel, kindSel, cmpSel].forEach(function (e) { e.addEventListener("change", render); });
    [lo, hi, text].forEach(function (e) { e.addEventListener("input", render); });
    // #samples&run=1&compare=0&show=bad&view=eval:4 opens the browser in that state (a link to share, a screenshot)
    var want = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) want[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1));
    });
    if (want.run !== undefined && byRun[want.run]) runSel.value = want.run;
    fillViews(want.view || null);
    if (want.show) kindSel.value = want.show;
    if (want.compare !== undefined && byRun[want.compare] && want.compare !== runSel.value) cmpSel.value = want.compare;
    render();
    if (/^#samples/.test(location.hash)) document.getElementById("samples").scrollIntoView();  // the id is taken by the state
  }

  initPlots();
  initBrowser();
  root.setAttribute("data-rrl-ready", "1");
})();
"""
