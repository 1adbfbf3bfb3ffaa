// pipesched search page, after report.js has drawn the timelines: clicking a dot of the Pareto
// plot (or a table row) selects that configuration everywhere: its dot, its rows in the tables
// (scrolled into view) and, when it is drawn, its timeline panel.
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("report-data").textContent);
  var keys = data.timelineKeys || [];

  function each(selector, action) {
    document.querySelectorAll(selector).forEach(action);
  }
  function select(key, scroll) {
    each(".selected", function (node) { node.classList.remove("selected"); });
    var wanted = '[data-key="' + key.replace(/["\\]/g, "\\$&") + '"]';
    each("svg.pareto circle" + wanted, function (dot) { dot.classList.add("selected"); });
    var rows = document.querySelectorAll("tr" + wanted);
    rows.forEach(function (row) { row.classList.add("selected"); });
    var index = keys.indexOf(key), panel = index < 0 ? null : document.querySelector('.panel[data-timeline="' + index + '"]');
    if (panel) panel.classList.add("selected");
    if (scroll && rows.length) rows[0].scrollIntoView({ block: "nearest" });
    document.body.setAttribute("data-selected", key);
  }
  each("svg.pareto circle[data-key]", function (dot) {
    dot.addEventListener("click", function () { select(dot.getAttribute("data-key"), true); });
  });
  each("tr[data-key]", function (row) {
    row.addEventListener("click", function () { select(row.getAttribute("data-key"), false); });
  });
})();
