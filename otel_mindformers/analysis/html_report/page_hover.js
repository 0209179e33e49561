// Hover read-outs: the value of every series at the step under the pointer (line charts)
// and the cell under it (heatmaps), from the JSON block beside each chart. The read-out is
// built as text nodes (never innerHTML): a label from the data shows as written.
(function () {
  function fmt(v, unit) {
    if (v === null || v === undefined) return "-";
    var text = Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(4));
    return unit ? text + (unit === "%" ? "%" : " " + unit) : text;
  }
  function svgX(svg, event) {
    var box = svg.getBoundingClientRect();
    return (event.clientX - box.left) / box.width * svg.viewBox.baseVal.width;
  }
  function svgY(svg, event) {
    var box = svg.getBoundingClientRect();
    return (event.clientY - box.top) / box.height * svg.viewBox.baseVal.height;
  }
  function nearest(xs, x) {
    var best = 0;
    for (var i = 1; i < xs.length; i++) if (Math.abs(xs[i] - x) < Math.abs(xs[best] - x)) best = i;
    return best;
  }
  // rows: [css class, text, bold text, text after] each, one <div> a row.
  function show(readout, rows, event, figure) {
    readout.textContent = "";
    rows.forEach(function (row) {
      var div = document.createElement("div");
      if (row[0]) div.className = row[0];
      div.appendChild(document.createTextNode(row[1]));
      if (row.length > 2) {
        var bold = document.createElement("b");
        bold.textContent = row[2];
        div.appendChild(bold);
        if (row[3]) div.appendChild(document.createTextNode(row[3]));
      }
      readout.appendChild(div);
    });
    readout.hidden = false;
    var box = figure.getBoundingClientRect();
    readout.style.left = Math.min(event.clientX - box.left + 14, box.width - 260) + "px";
    readout.style.top = (event.clientY - box.top + 14) + "px";
  }
  document.querySelectorAll("figure.line-chart").forEach(function (figure) {
    var block = figure.querySelector("script.hover-data");
    var svg = figure.querySelector("svg");
    var readout = figure.querySelector(".readout");
    if (!block || !svg || !readout) return;
    var data = JSON.parse(block.textContent);
    if (!data.x.length) return;
    var x0 = +svg.dataset.x0, x1 = +svg.dataset.x1, px0 = +svg.dataset.px0, px1 = +svg.dataset.px1;
    var guide = svg.querySelector(".guide");
    svg.addEventListener("mousemove", function (event) {
      var px = svgX(svg, event);
      if (px < px0 || px > px1) { readout.hidden = true; return; }
      var i = nearest(data.x, x0 + (px - px0) / (px1 - px0) * (x1 - x0));
      var gx = px0 + (data.x[i] - x0) / (x1 - x0) * (px1 - px0);
      guide.setAttribute("x1", gx); guide.setAttribute("x2", gx); guide.style.visibility = "visible";
      var rows = data.s.map(function (s) { return ["", String(s[0]) + ": ", fmt(s[1][i], data.u)]; });
      show(readout, [["at", "at " + fmt(data.x[i])]].concat(rows), event, figure);
    });
    svg.addEventListener("mouseleave", function () { readout.hidden = true; guide.style.visibility = "hidden"; });
  });
  document.querySelectorAll("figure.heatmap").forEach(function (figure) {
    var block = figure.querySelector("script.heat-data");
    var svg = figure.querySelector("svg");
    var readout = figure.querySelector(".readout");
    if (!block || !svg || !readout) return;
    var data = JSON.parse(block.textContent);
    var px0 = +svg.dataset.px0, px1 = +svg.dataset.px1, py0 = +svg.dataset.py0;
    var rowHeight = +svg.dataset.rowHeight, columns = +svg.dataset.columns;
    svg.addEventListener("mousemove", function (event) {
      var px = svgX(svg, event), py = svgY(svg, event);
      var column = Math.floor((px - px0) / (px1 - px0) * columns), row = Math.floor((py - py0) / rowHeight);
      if (column < 0 || column >= columns || row < 0 || row >= data.rows.length) { readout.hidden = true; return; }
      var width = (data.x1 - data.x0) / columns;
      var from = data.x0 + column * width, to = from + width;
      var value = data.v[row][column];
      var whose = data.r && data.r[row][column] !== null ? " (rank " + data.r[row][column] + ", the highest)" : "";
      show(readout, [["at", String(data.rows[row]) + ", steps " + fmt(from) + "–" + fmt(to)],
        ["", "", fmt(value, data.u), whose]], event, figure);
    });
    svg.addEventListener("mouseleave", function () { readout.hidden = true; });
  });
  document.body.setAttribute("data-ready", "1");
})();
