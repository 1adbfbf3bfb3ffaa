// pipesched comparison page (check --html), after report.js has drawn the timelines: ops keep
// their kind's colour (chunk shades as in the report) and are outlined by their duration's
// prediction error ((predicted - measured) / measured, computed by the page's writer: red where
// the run was slower than predicted, purple where faster); a checkbox fills them by it instead. The op where the two timelines first
// part is outlined dashed in both.
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("report-data").textContent);
  var FASTER = [123, 50, 148], NEUTRAL = [217, 221, 226], SLOWER = [192, 57, 43];
  var FULL = 0.5;      // |deviation| drawn at full strength
  var QUIET = 0.05;    // |deviation| below this gets no outline

  var lighten = window.pipeschedColors.lighten, chunkShade = window.pipeschedColors.chunkShade;
  function ramp(relative) {
    var f = Math.max(-1, Math.min(1, relative / FULL)), end = f < 0 ? SLOWER : FASTER, a = Math.abs(f);
    return "rgb(" + NEUTRAL.map(function (c, i) { return Math.round(c + (end[i] - c) * a); }).join(",") + ")";
  }
  function kindColor(t, row) {
    var ops = t.ops;
    return lighten(data.kinds.colors[ops.kind[row]], chunkShade(ops.chunk[row], t.chunks[ops.device[row]]));
  }
  // every op box by its "timeline:row" key, looked up once
  var boxes = {};
  document.querySelectorAll("rect[data-op]").forEach(function (rect) { boxes[rect.getAttribute("data-op")] = rect; });
  function node(index, row) {
    return boxes[index + ":" + row] || null;
  }

  // fill: the op kind (or the deviation); stroke: the deviation, wider the farther it is
  function paint(byDeviation) {
    data.timelines.forEach(function (t, index) {
      if (!t.deviation) return;
      for (var row = 0; row < t.ops.start.length; row++) {
        var rect = node(index, row), relative = t.deviation[row];
        if (!rect) continue;
        var known = relative !== null && relative !== undefined;
        rect.setAttribute("fill", byDeviation ? (known ? ramp(relative) : "#b8bec6") : kindColor(t, row));
        rect.setAttribute("data-deviation", known ? String(relative) : "");
        if (!byDeviation && known && Math.abs(relative) >= QUIET) {
          rect.style.stroke = ramp(relative);
          rect.style.strokeWidth = String(1 + 2 * Math.min(1, Math.abs(relative) / FULL));
        } else {
          rect.style.stroke = "";
          rect.style.strokeWidth = "";
        }
      }
    });
  }

  var toggle = document.getElementById("deviation-fill");
  paint(toggle && toggle.checked);
  if (toggle) toggle.addEventListener("change", function () { paint(toggle.checked); });

  (data.comparisons || []).forEach(function (c) {
    if (c.parting < 0) return;
    [node(c.predicted, c.parting), c.partingWith >= 0 ? node(c.measured, c.partingWith) : null].forEach(function (rect) {
      if (rect) rect.classList.add("parting");
    });
  });
  document.body.setAttribute("data-check-ready", "true");
})();
