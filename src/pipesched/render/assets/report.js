// pipesched report: sortable tables and interactive timelines, drawn from the JSON blob in
// #report-data. Plain DOM and SVG; all text from the data goes through textContent. A
// comparison page (data.comparisons) pairs a predicted and a measured timeline per schedule:
// one view for both, ops coloured by their deviation and linked to their counterpart.
(function () {
  "use strict";

  var SVGNS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var tooltip = document.getElementById("tooltip");

  // layout, pixels
  var GUTTER = 64;        // device and link names, left of the plot
  var SIDE = 96;          // idle share and memory peaks, right of the plot
  var ROW = 24;           // one device row
  var LINK_ROW = 11;      // one channel row
  var BOX = 0.78;         // op box height, fraction of ROW
  var AXIS = 34;          // time axis under the rows
  var MEMORY = 150;       // memory chart height
  var MAX_LABELS = 1500;  // box labels drawn per chart at once
  var STEPS_HEIGHT = 64;  // step-time plot height
  var DIST_HEIGHT = 56;   // one distribution plot's height
  var MIN_TRANSFER = 1.5; // pixels: the least drawn width of a transfer, however short
  var charts = [];        // drawn timeline charts by timeline index (their op boxes)

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVGNS, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function html(name, className, text, parent) {
    var node = document.createElement(name);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  function fmt(value) {
    return Number(value.toPrecision(6)).toString();
  }
  // seconds per display unit of a time in seconds; slots have none
  var SECONDS = { s: 1, ms: 1e-3, us: 1e-6 };
  function short(value) {
    return Number(value.toPrecision(3)).toString();
  }
  // a time in the display unit ``unit`` as "15.3 ms", in the unit that suits its size
  function fmtTime(value, unit) {
    if (!(unit in SECONDS)) return short(value) + " " + unit;
    var seconds = value * SECONDS[unit], size = Math.abs(seconds);
    if (size >= 1 || size === 0) return short(seconds) + " s";
    if (size >= 1e-3) return short(seconds * 1e3) + " ms";
    return short(seconds * 1e6) + " us";
  }
  function fmtMemory(value, unit) {
    return short(value) + " " + unit;
  }
  function lighten(hex, amount) {
    var out = "#";
    for (var i = 1; i < 7; i += 2) {
      var c = parseInt(hex.substr(i, 2), 16);
      var mixed = Math.round(c + (255 - c) * amount);
      out += (mixed < 16 ? "0" : "") + mixed.toString(16);
    }
    return out;
  }
  function chunkShade(chunk, chunks) {
    return chunks <= 1 ? 0 : 0.45 * chunk / (chunks - 1);
  }
  function niceStep(span, target) {
    var raw = span / target, power = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * power >= raw) return steps[i] * power;
    return 10 * power;
  }
  function opText(t, row) {
    var ops = t.ops;
    if (t.fused && t.fused[row] !== undefined) return t.fused[row];
    return ops.stage[row] + data.kinds.letters[ops.kind[row]] + ops.microbatch[row];
  }
  // a duration's prediction error, (predicted - measured) / measured: -50% (the run slower)
  // red, 0 grey, +50% (the run faster) purple
  function deviationColor(relative) {
    if (relative === null || relative === undefined) return "#b8bec6";
    var f = Math.max(-1, Math.min(1, relative / 0.5));
    var neutral = [217, 221, 226], end = f < 0 ? [192, 57, 43] : [123, 50, 148], a = Math.abs(f);
    return "rgb(" + neutral.map(function (c, i) { return Math.round(c + (end[i] - c) * a); }).join(",") + ")";
  }
  function percent(relative) {
    return (relative >= 0 ? "+" : "") + (100 * relative).toFixed(1) + "%";
  }
  function opLabel(t, row) {
    var ops = t.ops;
    if (t.fused && t.fused[row] !== undefined) return t.fused[row].replace(/^\((.*)\).*$/, "$1").replace(";", "&");
    if (t.chunks[ops.device[row]] > 1) return opText(t, row);
    return data.kinds.letters[ops.kind[row]] + ops.microbatch[row];
  }

  // ---- sortable tables ----------------------------------------------------------------
  function makeSortable(table) {
    var heads = table.querySelectorAll("th");
    heads.forEach(function (th, column) {
      function sort() {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].getAttribute("data-value"), y = b.cells[column].getAttribute("data-value");
          var nx = Number(x), ny = Number(y), order;
          if (x !== "" && y !== "" && !isNaN(nx) && !isNaN(ny)) order = nx - ny;
          else order = x.localeCompare(y);
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        reorderPanels(rows);
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); }
      });
    });
  }
  // the panels follow the order of a sorted table whose rows link to them
  function reorderPanels(rows) {
    var box = document.getElementById("timelines");
    if (!box) return;
    rows.forEach(function (row) {
      var link = row.getAttribute("data-link"), panel = link && link.indexOf("timeline-") === 0 ? document.getElementById(link) : null;
      if (panel && panel.parentNode === box) box.appendChild(panel);
    });
  }
  document.querySelectorAll("table.sortable").forEach(makeSortable);
  document.querySelectorAll('tr[data-link^="timeline-"]').forEach(function (row) {
    row.classList.add("linked-row");
    row.title = "show its timeline";
    row.addEventListener("click", function () {
      var panel = document.getElementById(row.getAttribute("data-link"));
      if (panel) { panel.scrollIntoView({ block: "start" }); panel.classList.add("flash"); setTimeout(function () { panel.classList.remove("flash"); }, 900); }
    });
  });

  // ---- views: each panel has its own time range; a compared pair shares one; "one time
  // axis" puts every panel of a unit on one range ------------------------------------------
  var views = {};
  var groups = {};         // time unit -> views that share a range when ``sharing``
  var sharing = false;
  function viewFor(t, index) {
    var key = t.view || "timeline-" + index;
    if (!views[key]) {
      var home = t.view ? [0, t.makespan || 1] : (t.home || [0, t.makespan || 1]);
      views[key] = { x0: home[0], x1: home[1], full: 0, home: home, charts: [] };
      if (!t.view) {
        var group = groups[t.timeUnit] || (groups[t.timeUnit] = { views: [], full: 0 });
        group.views.push(views[key]);
        group.full = Math.max(group.full, t.makespan || 1);
        views[key].group = group;
      }
    }
    var view = views[key];
    view.full = Math.max(view.full, t.makespan || 1);
    if (t.view) { view.home = [0, view.full]; view.x1 = view.full; }
    return view;
  }
  function redraw(view) {
    if (view.pending) return;
    view.pending = true;
    requestAnimationFrame(function () {
      view.pending = false;
      view.charts.forEach(function (chart) { chart.update(); });
    });
  }
  function setView(view, x0, x1) {
    var shared = sharing && view.group;
    var full = shared ? view.group.full : view.full;
    var span = Math.max(x1 - x0, full * 1e-6);
    if (span >= full) { x0 = 0; span = full; }
    x0 = Math.min(Math.max(x0, 0), full - span);
    (shared ? view.group.views : [view]).forEach(function (v) {
      v.x0 = x0;
      v.x1 = x0 + span;
      redraw(v);
    });
  }
  function resetView(view) {
    if (sharing && view.group) setView(view, 0, view.group.full);
    else setView(view, view.home[0], view.home[1]);
  }
  // zoom around the middle of what is visible, or around ``center``
  function zoom(view, factor, center) {
    var mid = center === undefined ? (view.x0 + view.x1) / 2 : center;
    setView(view, mid - (mid - view.x0) * factor, mid + (view.x1 - mid) * factor);
  }
  function pan(view, fraction) {
    var shift = (view.x1 - view.x0) * fraction;
    setView(view, view.x0 + shift, view.x1 + shift);
  }
  function shareAxis(on) {
    sharing = on;
    Object.keys(groups).forEach(function (unit) {
      groups[unit].views.forEach(function (v) {
        if (on) { v.x0 = 0; v.x1 = groups[unit].full; } else { v.x0 = v.home[0]; v.x1 = v.home[1]; }
        redraw(v);
      });
    });
  }

  // ---- tooltip ------------------------------------------------------------------------
  function showTip(event, title, rows, wait) {
    tooltip.textContent = "";
    html("div", "tip-title", title, tooltip);
    rows.forEach(function (pair) {
      var line = html("div", "tip-row", undefined, tooltip);
      html("span", "tip-key", pair[0] + ": ", line);
      line.appendChild(document.createTextNode(pair[1]));
    });
    if (wait) {
      var line = html("div", "tip-wait", undefined, tooltip);
      html("span", "tip-key", "waited for: ", line);
      line.appendChild(document.createTextNode(wait));
    }
    tooltip.hidden = false;
    moveTip(event);
  }
  function moveTip(event) {
    var x = event.clientX + 14, y = event.clientY + 14;
    var box = tooltip.getBoundingClientRect();
    if (x + box.width > window.innerWidth - 8) x = event.clientX - box.width - 14;
    if (y + box.height > window.innerHeight - 8) y = event.clientY - box.height - 14;
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
  }
  function hideTip() { tooltip.hidden = true; }

  function waitText(t, row) {
    var ops = t.ops, code = ops.cause[row], ref = ops.ref[row], unit = t.timeUnit;
    if (code === 0) return "nothing: it starts the iteration";
    if (code === 2) {
      var tr = t.transfers;
      return data.transferKinds.names[tr.kind[ref]] + " transfer of " + (t.serving ? "batch " : "microbatch ") + tr.microbatch[ref] +
        " from " + rowLabel(t, tr.src[ref]) + " to " + rowLabel(t, tr.dst[ref]) + " (" + (t.channels[tr.channel[ref]] || "") +
        "), arrived at " + fmtTime(tr.end[ref], unit);
    }
    var what = code === 1 ? "its input " : "the device: previous op ";
    return what + opText(t, ref) + " on " + rowLabel(t, ops.device[ref]) + ", ended at " + fmtTime(ops.end[ref], unit);
  }
  // a device's row label: d3, or a serving timeline's stage group (r0 s1)
  function rowLabel(t, d) { return t.serving ? t.serving.deviceLabels[d] : "d" + d; }
  // what a serving op's iteration batched (its microbatch is a batch of the run)
  function batchRows(t, mb) {
    var s = t.serving, listed = s.requestRows[mb], more = s.requests[mb] - listed.length;
    return [
      ["batch", String(s.batch[mb]) + " of the run (" + mb + " in this window)"],
      ["requests", s.requests[mb] + ": " + listed.join(", ") + (more > 0 ? " and " + more + " more" : "")],
      ["prefill tokens", String(s.prefillTokens[mb])],
      ["decodes", String(s.decodes[mb])],
      ["KV tokens read", String(s.kvTokens[mb])]
    ];
  }
  function opTip(t, row) {
    var ops = t.ops;
    var rows = t.serving ? [
      ["run", t.name + " (" + t.source + ")"],
      ["stage group", t.serving.deviceNames[ops.device[row]]]
    ].concat(batchRows(t, ops.microbatch[row])) : [
      ["schedule", t.name + (t.links ? " (" + t.source + ")" : "")],
      ["device", "d" + ops.device[row]],
      ["stage", String(ops.stage[row])],
      ["microbatch", String(ops.microbatch[row])]];
    rows = rows.concat([
      ["start", fmtTime(ops.start[row], t.timeUnit)],
      ["end", fmtTime(ops.end[row], t.timeUnit)],
      ["duration", fmtTime(ops.end[row] - ops.start[row], t.timeUnit)]
    ]);
    if (t.onPath && t.onPath.ops[row]) rows.push(["critical path", "on it"]);
    if (t.links) {
      var other = data.timelines[t.pairWith], partner = t.links[row];
      if (partner >= 0) {
        var o = other.ops;
        rows.push([other.source + " start", fmtTime(o.start[partner], t.timeUnit)]);
        rows.push([other.source + " duration", fmtTime(o.end[partner] - o.start[partner], t.timeUnit)]);
      } else {
        rows.push([other.source, "no counterpart"]);
      }
      // the page's one error, (predicted - measured) / measured, stated in its note
      if (t.deviation[row] !== null) rows.push(["duration error", percent(t.deviation[row])]);
    }
    return { title: opText(t, row) + " · " + data.kinds.names[ops.kind[row]], rows: rows, wait: waitText(t, row) };
  }
  function transferTip(t, row) {
    var tr = t.transfers, unit = t.timeUnit;
    var rows = [
      ["schedule", t.name],
      ["route", rowLabel(t, tr.src[row]) + " → " + rowLabel(t, tr.dst[row]) + " on " + (t.channels[tr.channel[row]] || "")],
      ["stage", String(tr.stage[row])],
      t.serving && tr.microbatch[row] < 0 ? ["request", String(t.serving.transferRequest[row])] :
        [t.serving ? "batch" : "microbatch", tr.microbatch[row] < 0 ? "all" : String(tr.microbatch[row])],
      ["bytes", formatBytes(tr.bytes[row])],
      ["start", fmtTime(tr.start[row], unit)],
      ["end", fmtTime(tr.end[row], unit)],
      ["duration", fmtTime(tr.end[row] - tr.start[row], unit)]
    ];
    return { title: data.transferKinds.names[tr.kind[row]] + " transfer", rows: rows, wait: null };
  }
  function formatBytes(value) {
    var units = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) if (value >= units[i][1]) return short(value / units[i][1]) + " " + units[i][0];
    return short(value) + " B";
  }

  // ---- one timeline chart -------------------------------------------------------------
  function drawTimeline(t, index, container) {
    var panel = html("div", "panel", undefined, container);
    panel.setAttribute("data-timeline", String(index));
    if (!t.view) panel.id = "timeline-" + index;
    var head = html("div", "panel-head", undefined, panel);
    html("h3", "", t.name, head);
    html("span", "headline", (t.links ? (t.source === "measured" ? "measured" : "predicted (" + t.source + ")") : t.source) +
      " · " + t.headline, head);
    var tools = html("span", "tools", undefined, head);
    var view = viewFor(t, index);
    [["−", "zoom out", function () { zoom(view, 1.6); }],
     ["+", "zoom in", function () { zoom(view, 1 / 1.6); }],
     ["reset", t.iterationEnd && t.iterationEnd.length >= 3 ? "show one steady iteration" : "show the whole iteration",
      function () { resetView(view); }]
    ].forEach(function (spec) {
      var button = html("button", "", spec[0], tools);
      button.type = "button";
      button.title = spec[1];
      button.addEventListener("click", spec[2]);
    });

    var channels = [];
    t.transfers.channel.forEach(function (c) { if (channels.indexOf(c) < 0) channels.push(c); });
    channels.sort(function (a, b) { return a - b; });
    // host links (activation offloads and reloads), then transfer channels, in thin rows
    var hosts = t.hostLanes || [];
    var hostTop = t.devices * ROW + (hosts.length ? 6 : 0);
    var linkTop = hostTop + hosts.length * LINK_ROW + (channels.length ? 6 : 0);
    var plotHeight = linkTop + channels.length * LINK_ROW;
    var height = plotHeight + AXIS;
    var svg = el("svg", { "class": "chart", height: height, role: "img" }, panel);
    svg.setAttribute("aria-label", "timeline of " + t.name);
    var clipId = "clip-" + index;
    var clip = el("rect", { x: GUTTER, y: 0, height: plotHeight }, el("clipPath", { id: clipId }, el("defs", {}, svg)));
    var grid = el("g", { "class": "grid" }, svg);
    var clipped = el("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    var idleBars = el("g", {}, clipped);
    var scaled = el("g", {}, clipped);
    var labels = el("g", {}, clipped);
    var side = el("g", {}, svg);

    // device rows: idle gaps (or one idle bar), name, idle share
    var gaps = t.gaps;
    if (gaps) {
      for (var g = 0; g < gaps.start.length; g++) {
        el("rect", { x: gaps.start[g], width: Math.max(gaps.end[g] - gaps.start[g], 0), y: gaps.device[g] * ROW + ROW * (1 - BOX) / 2,
                     height: ROW * BOX, fill: data.idleColor, "data-gap": index + ":" + g }, idleBars);
      }
    }
    for (var d = 0; d < t.devices; d++) {
      var y = d * ROW;
      if (!gaps) el("rect", { x: 0, y: y + ROW * (1 - BOX) / 2, width: t.makespan, height: ROW * BOX, fill: data.idleColor }, idleBars);
      var name = el("text", { x: GUTTER - 8, y: y + ROW / 2 + 4, "text-anchor": "end", "class": "row-label" }, svg);
      name.textContent = rowLabel(t, d);
      var idle = el("text", { y: y + ROW / 2 + 4, "class": "side-label" }, side);
      idle.textContent = Math.round(100 * t.idle[d] / (t.makespan || 1)) + "% idle";
    }
    // iterations back to back: a dashed line where each ended
    (t.iterationEnd || []).forEach(function (end, k) {
      var line = el("line", { x1: end, x2: end, y1: 0, y2: t.devices * ROW, "class": "iteration-end", "data-iteration-end": String(k) }, scaled);
      var note = el("title", {}, line);
      note.textContent = "iteration " + (k + 1) + " ends at " + fmtTime(end, t.timeUnit);
    });
    // op boxes, in time units horizontally (the group is scaled), pixels vertically
    var ops = t.ops, opNodes = new Array(ops.start.length);
    hosts.forEach(function (device, k) {
      var label = el("text", { x: GUTTER - 8, y: hostTop + k * LINK_ROW + LINK_ROW / 2 + 3, "text-anchor": "end", "class": "link-label" }, svg);
      label.textContent = rowLabel(t, device) + " host link";
    });
    for (var row = 0; row < ops.start.length; row++) {
      var device = ops.device[row];
      var color = t.deviation ? deviationColor(t.deviation[row])
        : lighten(data.kinds.colors[ops.kind[row]], chunkShade(ops.chunk[row], t.chunks[device]));
      var onHost = t.onHost && t.onHost[row];
      opNodes[row] = el("rect", {
        x: ops.start[row], width: Math.max(ops.end[row] - ops.start[row], 0),
        y: onHost ? hostTop + hosts.indexOf(device) * LINK_ROW + 2 : device * ROW + ROW * (1 - BOX) / 2,
        height: onHost ? LINK_ROW - 4 : ROW * BOX, fill: color,
        "data-op": index + ":" + row
      }, scaled);
    }
    // the critical path: its ops and transfers, looked up by row
    t.onPath = { ops: {}, transfers: {} };
    if (t.critical) {
      t.critical.ops.forEach(function (r) { t.onPath.ops[r] = true; if (opNodes[r]) opNodes[r].classList.add("on-path"); });
    }
    // link rows: one per channel, transfers coloured by what they carry
    var tr = t.transfers, transferNodes = new Array(tr.start.length);
    channels.forEach(function (channel, k) {
      var label = el("text", { x: GUTTER - 8, y: linkTop + k * LINK_ROW + LINK_ROW / 2 + 3, "text-anchor": "end", "class": "link-label" }, svg);
      label.textContent = t.channels[channel] || ("channel " + channel);
    });
    for (var j = 0; j < tr.start.length; j++) {
      var lane = channels.indexOf(tr.channel[j]);
      transferNodes[j] = el("rect", {
        x: tr.start[j], width: Math.max(tr.end[j] - tr.start[j], 0),
        y: linkTop + lane * LINK_ROW + 2, height: LINK_ROW - 4, fill: data.transferKinds.colors[tr.kind[j]],
        "data-transfer": index + ":" + j
      }, scaled);
    }
    if (t.critical) {
      t.critical.transfers.forEach(function (r) {
        t.onPath.transfers[r] = true;
        if (transferNodes[r]) transferNodes[r].classList.add("on-path");
      });
    }
    var axis = el("g", {}, svg);

    var chart = { svg: svg, update: null, opNodes: opNodes };
    charts[index] = chart;
    chart.update = function () {
      var width = svg.clientWidth || 800;
      var plot = Math.max(width - GUTTER - SIDE, 50);
      var k = plot / (view.x1 - view.x0);
      clip.setAttribute("width", plot);
      var transform = "translate(" + (GUTTER - view.x0 * k) + ",0) scale(" + k + ",1)";
      scaled.setAttribute("transform", transform);
      idleBars.setAttribute("transform", transform);
      side.setAttribute("transform", "translate(" + (GUTTER + plot + 6) + ",0)");
      // thin white edges between boxes once a typical box is a few pixels wide
      var typical = ops.start.length ? (ops.end[0] - ops.start[0]) * k : 0;
      svg.classList.toggle("edged", typical >= 4);
      if (k !== chart.k) {
        // a transfer is drawn at least MIN_TRANSFER pixels wide, however short it is
        chart.k = k;
        for (var j = 0; j < transferNodes.length; j++) {
          transferNodes[j].setAttribute("width", Math.max(tr.end[j] - tr.start[j], MIN_TRANSFER / k));
        }
      }
      svg.setAttribute("data-x0", String(view.x0));
      svg.setAttribute("data-x1", String(view.x1));
      drawLabels(k);
      drawAxis(axis, grid, view, k, plot, plotHeight, t.timeUnit);
    };
    function drawLabels(k) {
      labels.textContent = "";
      var drawn = 0;
      for (var row = 0; row < ops.start.length && drawn < MAX_LABELS; row++) {
        if (ops.end[row] < view.x0 || ops.start[row] > view.x1) continue;
        if (t.onHost && t.onHost[row]) continue;  // thin host-link boxes carry no label
        var text = opLabel(t, row);
        var pixels = (ops.end[row] - ops.start[row]) * k;
        if (pixels < text.length * 6.5 + 4) continue;
        var mid = GUTTER + ((ops.start[row] + ops.end[row]) / 2 - view.x0) * k;
        var label = el("text", { x: mid, y: ops.device[row] * ROW + ROW / 2 + 3.5, "text-anchor": "middle", "class": "op-label" }, labels);
        label.textContent = text;
        drawn++;
      }
    }

    // hover: the op's details, with the op or transfer it waited for outlined
    var marked = [];
    function unmark() { marked.forEach(function (n) { n.classList.remove("hovered", "cause", "linked"); }); marked = []; }
    svg.addEventListener("mouseover", function (event) {
      var target = event.target;
      unmark();
      if (target.hasAttribute("data-op")) {
        var row = Number(target.getAttribute("data-op").split(":")[1]);
        var tip = opTip(t, row);
        target.classList.add("hovered");
        marked.push(target);
        var cause = ops.cause[row] === 2 ? transferNodes[ops.ref[row]] : ops.cause[row] ? opNodes[ops.ref[row]] : null;
        if (cause) { cause.classList.add("cause"); marked.push(cause); }
        var counterpart = t.links && t.links[row] >= 0 && charts[t.pairWith] ? charts[t.pairWith].opNodes[t.links[row]] : null;
        if (counterpart) { counterpart.classList.add("linked"); marked.push(counterpart); }
        showTip(event, tip.title, tip.rows, tip.wait);
      } else if (target.hasAttribute("data-gap")) {
        var gap = Number(target.getAttribute("data-gap").split(":")[1]);
        var tip3 = gapTip(t, gap);
        var next = gaps.row[gap];
        if (next >= 0) {
          var why = ops.cause[next] === 2 ? transferNodes[ops.ref[next]] : ops.cause[next] ? opNodes[ops.ref[next]] : null;
          if (why) { why.classList.add("cause"); marked.push(why); }
          opNodes[next].classList.add("hovered");
          marked.push(opNodes[next]);
        }
        showTip(event, tip3.title, tip3.rows, tip3.wait);
      } else if (target.hasAttribute("data-transfer")) {
        var tip2 = transferTip(t, Number(target.getAttribute("data-transfer").split(":")[1]));
        target.classList.add("hovered");
        marked.push(target);
        showTip(event, tip2.title, tip2.rows, null);
      } else {
        hideTip();
      }
    });
    svg.addEventListener("mousemove", function (event) { if (!tooltip.hidden) moveTip(event); });
    svg.addEventListener("mouseleave", function () { unmark(); hideTip(); });
    // click an op to pin its microbatch (the search box then finds it in every panel)
    svg.addEventListener("click", function (event) {
      if (!event.target.hasAttribute("data-op") || svg.getAttribute("data-dragged") === "true") return;
      var row = Number(event.target.getAttribute("data-op").split(":")[1]);
      pinMicrobatch(ops.microbatch[row]);
    });
    attachZoom(svg, view, function (a, b) { measureWindow(t, panel, a, b); });
    view.charts.push(chart);

    if (t.memory && !t.links) drawMemory(t, index, panel, view);  // a compared pair stays adjacent
    if (t.critical && !t.links) listCriticalPath(t, panel);
    return chart;
  }

  // ---- time axis with round ticks and grid lines --------------------------------------
  function drawAxis(axis, grid, view, k, plot, plotHeight, unit) {
    axis.textContent = "";
    grid.textContent = "";
    var step = niceStep(view.x1 - view.x0, Math.max(2, Math.floor(plot / 90)));
    var first = Math.ceil(view.x0 / step) * step;
    for (var x = first; x <= view.x1 + step * 1e-9; x += step) {
      var px = GUTTER + (x - view.x0) * k;
      el("line", { x1: px, x2: px, y1: 0, y2: plotHeight, stroke: "#e3e7eb" }, grid);
      var tick = el("g", { "class": "tick" }, axis);
      el("line", { x1: px, x2: px, y1: plotHeight, y2: plotHeight + 4, stroke: "#8c959f" }, tick);
      var label = el("text", { x: px, y: plotHeight + 15, "text-anchor": "middle" }, tick);
      label.textContent = fmt(x);
    }
    el("line", { x1: GUTTER, x2: GUTTER + plot, y1: plotHeight, y2: plotHeight, stroke: "#8c959f" }, axis);
    var title = el("text", { x: GUTTER + plot / 2, y: plotHeight + 30, "text-anchor": "middle", "class": "axis-title" }, axis);
    title.textContent = "time (" + unit + ")";
  }

  // ---- memory curves ------------------------------------------------------------------
  function deviceColor(d, devices) {
    // a viridis-like ramp, dark purple (first device) through teal to green (last device);
    // red stays reserved for out-of-memory devices
    var stops = [[68, 1, 84], [49, 104, 142], [33, 145, 140], [94, 201, 98]];
    var f = devices > 1 ? d / (devices - 1) : 0, at = f * (stops.length - 1);
    var i = Math.min(Math.floor(at), stops.length - 2), w = at - i;
    return "rgb(" + stops[i].map(function (c, j) { return Math.round(c + (stops[i + 1][j] - c) * w); }).join(",") + ")";
  }
  function drawMemory(t, index, panel, view) {
    var memory = t.memory, host = t.hostMemory;
    var top = Math.max.apply(null, memory.peak.concat(host ? host.peak : []).concat([1e-12]));
    var caps = memory.capacity;
    var showCaps = caps && Math.min.apply(null, caps) < 1.25 * top;
    if (showCaps) top = Math.max(top, Math.max.apply(null, caps));
    top *= 1.08;
    var oomDevices = [];
    memory.oom.forEach(function (oom, d) { if (oom) oomDevices.push(rowLabel(t, d)); });
    var title = html("p", "memory-title", (t.serving ? "KV cache in use per stage group (" : "memory in use per device (") + memory.unit + ")" + (showCaps ? "; dashed: capacity" : "") +
      (host ? "; dotted: host memory of offloaded activations" : "") + "; hover for the values at a time", panel);
    if (oomDevices.length) {
      var oomNote = html("span", "oom-note", " out of memory: " + oomDevices.join(", ") + " (red above the capacity)", title);
      oomNote.setAttribute("data-oom", oomDevices.join(","));
    }
    title.setAttribute("data-memory", String(index));
    var height = MEMORY + AXIS;
    var svg = el("svg", { "class": "chart", height: height, role: "img" }, panel);
    svg.setAttribute("aria-label", "memory of " + t.name);
    var clipId = "mclip-" + index;
    var clip = el("rect", { x: GUTTER, y: 0, height: MEMORY }, el("clipPath", { id: clipId }, el("defs", {}, svg)));
    var grid = el("g", {}, svg);
    var yAxis = el("g", {}, svg);
    var scaled = el("g", {}, el("g", { "clip-path": "url(#" + clipId + ")" }, svg));
    var axis = el("g", {}, svg);
    function y(value) { return MEMORY - 4 - (MEMORY - 8) * value / top; }
    var ystep = niceStep(top, 4);
    for (var v = 0; v <= top; v += ystep) {
      el("line", { x1: GUTTER, x2: "100%", y1: y(v), y2: y(v), stroke: "#eef1f4" }, yAxis);
      var label = el("text", { x: GUTTER - 8, y: y(v) + 4, "text-anchor": "end", "class": "side-label" }, yAxis);
      label.textContent = fmt(v);
    }
    var unitLabel = el("text", { x: 4, y: 12, "class": "side-label" }, yAxis);
    unitLabel.textContent = memory.unit;
    memory.times.forEach(function (times, d) {
      var values = memory.values[d], points = [];
      for (var i = 0; i < times.length; i++) {
        if (i > 0) points.push(times[i] + "," + y(values[i - 1]));
        points.push(times[i] + "," + y(values[i]));
      }
      if (times.length) points.push(t.makespan + "," + y(values[values.length - 1]));
      el("polyline", { points: points.join(" "), stroke: deviceColor(d, t.devices), "data-memory-device": d }, scaled);
      if (memory.oom[d] && caps) {
        // the part above the capacity, in red
        var above = "mabove-" + index + "-" + d;
        el("rect", { x: -t.makespan, width: 3 * t.makespan, y: 0, height: y(caps[d]) }, el("clipPath", { id: above }, el("defs", {}, svg)));
        el("polyline", { points: points.join(" "), stroke: data.oomColor, "clip-path": "url(#" + above + ")", "class": "over-capacity",
                         "data-over-capacity": d }, scaled);
      }
      if (showCaps) {
        el("polyline", { "class": "capacity", points: "0," + y(caps[d]) + " " + t.makespan + "," + y(caps[d]), stroke: data.oomColor }, scaled);
      }
    });
    if (host) host.times.forEach(function (times, d) {
      if (!host.peak[d]) return;
      var values = host.values[d], points = [];
      for (var i = 0; i < times.length; i++) {
        if (i > 0) points.push(times[i] + "," + y(values[i - 1]));
        points.push(times[i] + "," + y(values[i]));
      }
      if (times.length) points.push(t.makespan + "," + y(values[values.length - 1]));
      el("polyline", { "class": "host-memory", points: points.join(" "), stroke: deviceColor(d, t.devices),
                       "data-host-memory-device": d }, scaled);
    });
    // the value of every device's memory at the time under the cursor
    function valueAt(times, values, time) {
      var lo = 0, hi = times.length - 1, found = -1;
      while (lo <= hi) { var mid = (lo + hi) >> 1; if (times[mid] <= time) { found = mid; lo = mid + 1; } else hi = mid - 1; }
      return found < 0 ? 0 : values[found];
    }
    var cursor = el("line", { "class": "memory-cursor", y1: 0, y2: MEMORY, x1: -10, x2: -10 }, svg);
    svg.addEventListener("mousemove", function (event) {
      var box = svg.getBoundingClientRect(), plot = Math.max(box.width - GUTTER - SIDE, 50);
      var px = event.clientX - box.left;
      if (px < GUTTER || px > GUTTER + plot) { hideTip(); cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); return; }
      var time = view.x0 + (px - GUTTER) / plot * (view.x1 - view.x0);
      cursor.setAttribute("x1", px);
      cursor.setAttribute("x2", px);
      var rows = memory.times.map(function (times, d) {
        var value = valueAt(times, memory.values[d], time);
        var text = fmtMemory(value, memory.unit) + " (peak " + fmtMemory(memory.peak[d], memory.unit) + ")";
        if (caps && value > caps[d]) text += " over " + fmtMemory(caps[d], memory.unit);
        if (host && host.peak[d]) text += ", host " + fmtMemory(valueAt(host.times[d], host.values[d], time), memory.unit);
        return [rowLabel(t, d), text];
      });
      showTip(event, "memory at " + fmtTime(time, t.timeUnit), rows, caps ? "capacity " + fmtMemory(Math.min.apply(null, caps), memory.unit) : null);
    });
    svg.addEventListener("mouseleave", function () { cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); });
    // right of the plot: the peak, and which colour is which end of the device range
    var side = el("g", {}, svg);
    var peaks = el("text", { y: 14, "class": "side-label" }, side);
    peaks.textContent = "peak " + fmtMemory(Math.max.apply(null, memory.peak), memory.unit);
    [0, t.devices - 1].forEach(function (d, k) {
      if (k === 1 && d === 0) return;
      var key = el("text", { y: 32 + 14 * k, "class": "side-label" }, side);
      key.setAttribute("style", "fill:" + deviceColor(d, t.devices) + ";font-weight:600");
      key.textContent = "— " + rowLabel(t, d);
    });
    var chart = {
      update: function () {
        var width = svg.clientWidth || 800;
        var plot = Math.max(width - GUTTER - SIDE, 50);
        var k = plot / (view.x1 - view.x0);
        clip.setAttribute("width", plot);
        scaled.setAttribute("transform", "translate(" + (GUTTER - view.x0 * k) + ",0) scale(" + k + ",1)");
        side.setAttribute("transform", "translate(" + (GUTTER + plot + 6) + ",0)");
        drawAxis(axis, grid, view, k, plot, MEMORY, t.timeUnit);
      }
    };
    svg.addEventListener("mouseleave", hideTip);
    attachZoom(svg, view);
    view.charts.push(chart);
  }

  // ---- ctrl+wheel zoom (the wheel alone scrolls the page), drag pan, shift+drag measure,
  // double-click reset; + - w s a d 0 on the hovered panel ------------------------------------
  var hoveredView = null;
  function attachZoom(svg, view, onWindow) {
    function plotWidth() {
      return Math.max(svg.getBoundingClientRect().width - GUTTER - SIDE, 50);
    }
    function timeAt(clientX) {
      var box = svg.getBoundingClientRect();
      return view.x0 + (clientX - box.left - GUTTER) / plotWidth() * (view.x1 - view.x0);
    }
    svg.addEventListener("wheel", function (event) {
      if (!event.ctrlKey && !event.metaKey) return;
      event.preventDefault();
      var factor = Math.exp(Math.max(-1, Math.min(1, event.deltaY / 300)));
      zoom(view, factor, timeAt(event.clientX));
    }, { passive: false });
    svg.addEventListener("mouseenter", function () { hoveredView = view; });
    svg.addEventListener("mouseleave", function () { if (hoveredView === view) hoveredView = null; });
    var drag = null, band = null;
    svg.addEventListener("mousedown", function (event) {
      if (event.button !== 0) return;
      event.preventDefault();
      drag = { x: event.clientX, x0: view.x0, x1: view.x1, measure: event.shiftKey && !!onWindow, t0: timeAt(event.clientX) };
      svg.setAttribute("data-dragged", "false");
      if (drag.measure) band = el("rect", { "class": "window", y: 0, height: svg.getAttribute("height") - AXIS, width: 0 }, svg);
      else svg.classList.add("dragging");
    });
    window.addEventListener("mousemove", function (event) {
      if (!drag) return;
      if (Math.abs(event.clientX - drag.x) > 3) svg.setAttribute("data-dragged", "true");
      var box = svg.getBoundingClientRect();
      if (drag.measure) {
        var a = Math.min(drag.x, event.clientX) - box.left, b = Math.max(drag.x, event.clientX) - box.left;
        band.setAttribute("x", Math.max(a, GUTTER));
        band.setAttribute("width", Math.max(0, Math.min(b, GUTTER + plotWidth()) - Math.max(a, GUTTER)));
        return;
      }
      var shift = (event.clientX - drag.x) / plotWidth() * (drag.x1 - drag.x0);
      setView(view, drag.x0 - shift, drag.x1 - shift);
    });
    window.addEventListener("mouseup", function (event) {
      if (drag && drag.measure) {
        var t1 = timeAt(event.clientX);
        if (band) band.remove();
        band = null;
        if (Math.abs(event.clientX - drag.x) > 3) onWindow(Math.min(drag.t0, t1), Math.max(drag.t0, t1));
      }
      drag = null;
      svg.classList.remove("dragging");
    });
    svg.addEventListener("dblclick", function () { resetView(view); });
  }
  document.addEventListener("keydown", function (event) {
    if (!hoveredView || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target && /^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName)) return;
    var actions = {
      "+": function () { zoom(hoveredView, 1 / 1.6); }, "=": function () { zoom(hoveredView, 1 / 1.6); },
      "w": function () { zoom(hoveredView, 1 / 1.6); }, "-": function () { zoom(hoveredView, 1.6); },
      "s": function () { zoom(hoveredView, 1.6); }, "a": function () { pan(hoveredView, -0.2); },
      "d": function () { pan(hoveredView, 0.2); }, "0": function () { resetView(hoveredView); }
    };
    if (actions[event.key]) { event.preventDefault(); actions[event.key](); }
  });

  // ---- why: idle gaps, the critical path, busy and idle time in a window ------------------
  function gapTip(t, gap) {
    var gaps = t.gaps, row = gaps.row[gap], unit = t.timeUnit, rows = [["schedule", t.name], ["device", rowLabel(t, gaps.device[gap])]];
    var length = gaps.end[gap] - gaps.start[gap];
    gaps.parts[gap].forEach(function (value, k) { if (value > 0) rows.push([data.bubbleParts[k], fmtTime(value, unit)]); });
    rows.push(["from", fmtTime(gaps.start[gap], unit) + " to " + fmtTime(gaps.end[gap], unit)]);
    var wait;
    if (row < 0) wait = "nothing: the device's last op has ended (cool-down)";
    else wait = waitText(t, row) + ", before " + opText(t, row);
    var title = "idle " + fmtTime(length, unit) + (row < 0 ? ", cool-down" : gaps.parts[gap][0] > 0 ? ", warm-up" : "");
    var ops = t.ops;
    if (row >= 0 && ops.cause[row] === 2) {
      var tr = t.transfers, ref = ops.ref[row];
      title += ", waiting for the " + tr.src[ref] + "->" + tr.dst[ref] + " " + data.transferKinds.names[tr.kind[ref]] + " of mb " + tr.microbatch[ref];
    } else if (row >= 0 && ops.cause[row] === 1) {
      title += ", waiting for " + opText(t, ops.ref[row]) + " on d" + ops.device[ops.ref[row]];
    }
    return { title: title, rows: rows, wait: wait };
  }
  function listCriticalPath(t, panel) {
    var box = html("details", "critical-list", undefined, panel);
    var ops = t.ops, tr = t.transfers, unit = t.timeUnit, items = [];
    t.critical.ops.forEach(function (r) { items.push([ops.start[r], opText(t, r) + " on d" + ops.device[r], ops.end[r]]); });
    t.critical.transfers.forEach(function (r) {
      items.push([tr.start[r], data.transferKinds.names[tr.kind[r]] + " transfer of mb " + tr.microbatch[r] + " d" + tr.src[r] + "->d" + tr.dst[r], tr.end[r]]);
    });
    items.sort(function (a, b) { return a[0] - b[0]; });
    var compute = 0, comm = 0;
    t.critical.ops.forEach(function (r) { compute += ops.end[r] - ops.start[r]; });
    t.critical.transfers.forEach(function (r) { comm += tr.end[r] - tr.start[r]; });
    html("summary", "", "critical path: " + t.critical.ops.length + " ops (" + fmtTime(compute, unit) + ") and " +
      t.critical.transfers.length + " transfers (" + fmtTime(comm, unit) + ")", box);
    var list = html("ol", "", undefined, box);
    items.forEach(function (item) { html("li", "", item[1] + ": " + fmtTime(item[0], unit) + " – " + fmtTime(item[2], unit), list); });
  }
  // busy time per op kind and idle time of every device's compute stream in [a, b]
  function measureWindow(t, panel, a, b) {
    var ops = t.ops, busy = {}, total = 0, unit = t.timeUnit;
    for (var row = 0; row < ops.start.length; row++) {
      if (t.onHost && t.onHost[row]) continue;
      var overlap = Math.min(ops.end[row], b) - Math.max(ops.start[row], a);
      if (overlap <= 0) continue;
      var name = data.kinds.letters[ops.kind[row]];
      busy[name] = (busy[name] || 0) + overlap;
      total += overlap;
    }
    var span = (b - a) * t.devices;
    var box = panel.querySelector(".window-stats") || html("p", "window-stats", undefined, panel);
    panel.insertBefore(box, panel.querySelector("svg"));
    var parts = Object.keys(busy).sort().map(function (k) {
      return k + " " + fmtTime(busy[k], unit) + " (" + (100 * busy[k] / span).toFixed(1) + "%)";
    });
    parts.push("idle " + fmtTime(span - total, unit) + " (" + (100 * (span - total) / span).toFixed(1) + "%)");
    box.textContent = "window " + fmtTime(a, unit) + " – " + fmtTime(b, unit) + " × " + t.devices + " devices: " + parts.join(" · ");
    box.setAttribute("data-busy", JSON.stringify(busy));
    box.setAttribute("data-idle", String(span - total));
  }

  // ---- search: ops by kind, stage, microbatch, device, in every panel ---------------------
  var searchBox = document.getElementById("op-search");
  function parseQuery(text) {
    var query = {}, words = text.trim().toLowerCase().replace(/[,;]/g, " ").split(/\s+/).filter(Boolean);
    var fields = { mb: "microbatch", microbatch: "microbatch", m: "microbatch", stage: "stage", s: "stage",
                   dev: "device", device: "device", d: "device" };
    for (var i = 0; i < words.length; i++) {
      var word = words[i], glued = /^([a-z]+)(\d+)$/.exec(word), op = /^(\d+)([a-z])(\d+)$/.exec(word);
      if (fields[word] && i + 1 < words.length && /^\d+$/.test(words[i + 1])) { query[fields[word]] = Number(words[++i]); continue; }
      if (glued && fields[glued[1]]) { query[fields[glued[1]]] = Number(glued[2]); continue; }
      if (op) { query.stage = Number(op[1]); query.kind = op[2]; query.microbatch = Number(op[3]); continue; }
      query.kind = word;
    }
    return query;
  }
  function kindMatches(kind, word) {
    var letter = data.kinds.letters[kind].toLowerCase(), name = data.kinds.names[kind].toLowerCase();
    return letter === word || name === word || name.split(/[ ()]+/)[0] === word;
  }
  function runSearch() {
    var text = searchBox ? searchBox.value : "";
    var query = parseQuery(text), empty = !text.trim(), found = 0, panels = 0;
    document.body.classList.toggle("searching", !empty);
    charts.forEach(function (chart, index) {
      if (!chart) return;
      var ops = data.timelines[index].ops, here = 0;
      for (var row = 0; row < chart.opNodes.length; row++) {
        var hit = !empty && (query.microbatch === undefined || ops.microbatch[row] === query.microbatch) &&
          (query.stage === undefined || ops.stage[row] === query.stage) &&
          (query.device === undefined || ops.device[row] === query.device) &&
          (query.kind === undefined || kindMatches(ops.kind[row], query.kind));
        chart.opNodes[row].classList.toggle("match", hit);
        if (hit) here++;
      }
      found += here;
      if (here) panels++;
    });
    var count = document.getElementById("search-count");
    if (count) count.textContent = empty ? "" : found + " ops in " + panels + " panels";
  }
  function pinMicrobatch(microbatch) {
    if (!searchBox) return;
    var text = "mb " + microbatch;
    searchBox.value = searchBox.value === text ? "" : text;
    runSearch();
  }
  if (searchBox) searchBox.addEventListener("input", runSearch);

  // ---- measured step times against the prediction --------------------------------------
  // the measured steps (dots, the median step marked), the deterministic prediction (dashed)
  // and the prediction's Monte Carlo p50 (solid) and p50-p99 band; each step's error is the
  // page writer's, (predicted - measured) / measured, positive when the run is faster
  function drawSteps(c, container) {
    var steps = c.steps, unit = " " + c.timeUnit, band = c.predictedP50 !== null && c.predictedP50 !== undefined;
    var svg = el("svg", { "class": "chart steps-plot", height: STEPS_HEIGHT + AXIS, role: "img" }, container);
    svg.setAttribute("aria-label", "measured step times of " + c.name);
    var values = steps.concat([c.predictedTime]).concat(band ? [c.predictedP50, c.predictedP99] : []);
    var lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    var pad = Math.max((hi - lo) * 0.15, hi * 0.02, 1e-9);
    lo = Math.max(0, lo - pad);
    hi += pad;
    var grid = el("g", {}, svg), axis = el("g", {}, svg), marks = el("g", {}, svg);
    var sorted = steps.slice().sort(function (a, b) { return a - b; });
    // the median step: the measured timeline drawn above (its time is the reported one)
    var median = c.measuredTime;
    var legend = html("div", "steps-legend", undefined, container);
    function short(v) { return Number(v.toPrecision(4)).toString(); }
    [["dot", "measured step"], ["median", "median step " + short(median) + unit + " (drawn above)"],
     ["pred", "predicted " + short(c.predictedTime) + unit + " (every op at its median cost)"]]
      .concat(band ? [["p50", "predicted p50 " + short(c.predictedP50) + unit],
                      ["band", "predicted p50 – p99 (" + short(c.predictedP50) + " – " + short(c.predictedP99) + unit +
                       ", every op drawn from its profiled repeats)"]] : [])
      .forEach(function (spec) {
        var item = html("span", "", undefined, legend);
        html("span", "key " + spec[0], undefined, item);
        item.appendChild(document.createTextNode(spec[1]));
      });
    if (!band) html("span", "", "no predicted p50 – p99: the profile kept no repeats", legend);
    function update() {
      var width = svg.clientWidth || 800, plot = Math.max(width - GUTTER - SIDE, 50), k = plot / (hi - lo);
      function x(v) { return GUTTER + (v - lo) * k; }
      marks.textContent = "";
      var mid = STEPS_HEIGHT / 2;
      if (band) {
        var rect = el("rect", { "class": "steps-band", x: x(c.predictedP50), y: 4, height: STEPS_HEIGHT - 8,
                                width: Math.max(x(c.predictedP99) - x(c.predictedP50), 1) }, marks);
        rect.setAttribute("data-p50", fmt(c.predictedP50));
        rect.setAttribute("data-p99", fmt(c.predictedP99));
        el("line", { "class": "predicted-p50", x1: x(c.predictedP50), x2: x(c.predictedP50), y1: 4, y2: STEPS_HEIGHT - 4 }, marks);
      }
      if (sorted.length) {
        el("line", { "class": "steps-range", x1: x(sorted[0]), x2: x(sorted[sorted.length - 1]), y1: mid, y2: mid }, marks);
        el("line", { "class": "steps-median", x1: x(median), x2: x(median), y1: mid - 14, y2: mid + 14 }, marks);
      }
      var line = el("line", { "class": "predicted-line", x1: x(c.predictedTime), x2: x(c.predictedTime), y1: 4, y2: STEPS_HEIGHT - 4 }, marks);
      line.setAttribute("data-predicted", fmt(c.predictedTime));
      steps.forEach(function (value, i) {
        var dot = el("circle", { cx: x(value), cy: mid + ((i % 5) - 2) * 4, r: 4, "data-step": String(i) }, marks);
        dot.addEventListener("mouseover", function (event) {
          var rows = [["schedule", c.name], ["step time", fmt(value) + unit],
            ["error", percent(c.stepError[i])]];
          if (band) rows.push(["error of the p50", percent(c.stepErrorP50[i])]);
          showTip(event, "step " + (i + 1) + " of " + steps.length + (value === median ? " (the median step, drawn above)" : ""), rows, null);
        });
        dot.addEventListener("mouseout", hideTip);
      });
      drawAxis(axis, grid, { x0: lo, x1: hi }, k, plot, STEPS_HEIGHT, c.timeUnit);
    }
    update();
    return update;
  }

  // ---- Monte Carlo iteration times, one histogram per schedule on one axis ---------------
  // each plot with its own time axis (all on the same bins) and a count axis on the left
  function drawDistributions(d, container) {
    var edges = d.edges, lo = edges[0], hi = edges[edges.length - 1], unit = " " + d.unit;
    var peak = Math.max.apply(null, d.rows.map(function (r) { return Math.max.apply(null, r.counts); })) || 1;
    var updates = [];
    // one legend for every plot: what the bars and the three lines are
    var legend = html("div", "steps-legend dist-legend", undefined, container);
    [["bin", "samples per bin (the count axis on the left)"], ["deterministic", "deterministic iteration time"],
     ["mean", "mean"], ["p99", "p99"]].forEach(function (spec) {
      var item = html("span", "", undefined, legend);
      html("span", "key mark-" + spec[0], undefined, item);
      item.appendChild(document.createTextNode(spec[1]));
    });
    d.rows.forEach(function (r, k) {
      var box = html("div", "distribution", undefined, container);
      box.setAttribute("data-distribution", String(k));
      var ahead = r.fasterThanNext === null || r.fasterThanNext === undefined ? "" :
        "; faster than " + r.next + " in " + (100 * r.fasterThanNext).toFixed(1) + "% of samples";
      function short(v) { return Number(v.toPrecision(4)).toString(); }
      html("h3", "", r.name + ": deterministic " + short(r.deterministic) + unit + ", mean " + short(r.mean) + unit +
           ", p99 " + short(r.p99) + unit +
           (r.fastest === null ? ", " : ", fastest in " + (100 * r.fastest).toFixed(1) + "% of ") + r.samples + " samples" +
           ahead, box);
      var svg = el("svg", { "class": "chart distribution-plot", height: DIST_HEIGHT + AXIS, role: "img" }, box);
      svg.setAttribute("aria-label", "iteration time distribution of " + r.name);
      var grid = el("g", {}, svg), axis = el("g", {}, svg), counts = el("g", { "class": "count-axis" }, svg), marks = el("g", {}, svg);
      function barHeight(count) { return (DIST_HEIGHT - 6) * count / peak; }
      function update() {
        var width = svg.clientWidth || 800, plot = Math.max(width - GUTTER - SIDE, 50), k2 = plot / (hi - lo);
        function x(v) { return GUTTER + (v - lo) * k2; }
        marks.textContent = "";
        counts.textContent = "";
        r.counts.forEach(function (count, b) {
          if (!count) return;
          var h = barHeight(count);
          var bar = el("rect", { "class": "bin", x: x(edges[b]), y: DIST_HEIGHT - h, width: Math.max(x(edges[b + 1]) - x(edges[b]) - 1, 1),
                                 height: h, "data-bin": String(b) }, marks);
          bar.addEventListener("mouseover", function (event) {
            showTip(event, r.name, [["iteration time", fmt(edges[b]) + " – " + fmt(edges[b + 1]) + unit],
              ["samples", count + " of " + r.samples + " (" + (100 * count / r.samples).toFixed(1) + "%)"]], null);
          });
          bar.addEventListener("mouseout", hideTip);
        });
        [["deterministic", r.deterministic], ["mean", r.mean], ["p99", r.p99]].forEach(function (spec) {
          var line = el("line", { "class": "dist-" + spec[0], x1: x(spec[1]), x2: x(spec[1]), y1: 2, y2: DIST_HEIGHT }, marks);
          line.setAttribute("data-value", fmt(spec[1]));
        });
        // the count axis: 0, half the tallest bar of the page, the tallest
        el("line", { x1: GUTTER, x2: GUTTER, y1: DIST_HEIGHT - barHeight(peak), y2: DIST_HEIGHT, stroke: "#8c959f" }, counts);
        [0, Math.round(peak / 2), peak].forEach(function (value, i) {
          if (i === 1 && (value === 0 || value === peak)) return;
          var y = DIST_HEIGHT - barHeight(value);
          el("line", { x1: GUTTER - 4, x2: GUTTER, y1: y, y2: y, stroke: "#8c959f" }, counts);
          var label = el("text", { x: GUTTER - 6, y: y + 3.5, "text-anchor": "end", "class": "side-label", "data-count": String(value) }, counts);
          label.textContent = String(value);
        });
        var title = el("text", { x: 14, y: DIST_HEIGHT / 2, "text-anchor": "middle", "class": "side-label",
                                 transform: "rotate(-90 14 " + DIST_HEIGHT / 2 + ")" }, counts);
        title.textContent = "samples";
        drawAxis(axis, grid, { x0: lo, x1: hi }, k2, plot, DIST_HEIGHT, d.unit);
      }
      update();
      updates.push(update);
    });
    return function () { updates.forEach(function (update) { update(); }); };
  }

  // ---- build ----------------------------------------------------------------------------
  var container = document.getElementById("timelines");
  var stepPlots = [];
  if (data.comparisons) {
    data.comparisons.forEach(function (c, k) {
      var pair = document.getElementById("pair-" + k);
      drawTimeline(data.timelines[c.predicted], c.predicted, pair);
      drawTimeline(data.timelines[c.measured], c.measured, pair);
      stepPlots.push(drawSteps(c, document.getElementById("steps-" + k)));
    });
    // a row of a deviation table outlines its op in both timelines
    document.querySelectorAll("tr[data-link]").forEach(function (tr) {
      var parts = tr.getAttribute("data-link").split(":").map(Number), c = data.comparisons[parts[0]];
      var nodes = [charts[c.predicted].opNodes[parts[1]], parts[2] >= 0 ? charts[c.measured].opNodes[parts[2]] : null]
        .filter(function (n) { return n; });
      tr.addEventListener("mouseenter", function () { nodes.forEach(function (n) { n.classList.add("linked"); }); });
      tr.addEventListener("mouseleave", function () { nodes.forEach(function (n) { n.classList.remove("linked"); }); });
    });
  } else {
    data.timelines.forEach(function (t, index) { drawTimeline(t, index, container); });
  }
  var share = document.getElementById("share-axis");
  if (share) share.addEventListener("change", function () { shareAxis(share.checked); });
  if (share && share.checked) shareAxis(true);  // the page was written with --share-axis
  var critical = document.getElementById("show-critical");
  if (critical) critical.addEventListener("change", function () { document.body.classList.toggle("show-critical", critical.checked); });
  if (data.distributions) stepPlots.push(drawDistributions(data.distributions, document.getElementById("distributions")));
  Object.keys(views).forEach(function (key) {
    var view = views[key];
    view.charts.forEach(function (chart) { chart.update(); });
  });
  var resizing = null;
  window.addEventListener("resize", function () {
    if (resizing) cancelAnimationFrame(resizing);
    resizing = requestAnimationFrame(function () {
      Object.keys(views).forEach(function (key) { views[key].charts.forEach(function (chart) { chart.update(); }); });
      stepPlots.forEach(function (update) { update(); });
    });
  });
  // the colour helpers the page's other scripts (check.js) share
  window.pipeschedColors = { lighten: lighten, chunkShade: chunkShade };
  document.body.setAttribute("data-ready", "true");
})();
