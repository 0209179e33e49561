// Runs first: every script error, console error or warning and blocked request (the page's
// Content-Security-Policy forbids every fetch) is written into #page-errors, shown at the
// top of the page, where a reader and a test both see it.
(function () {
  var found = [];
  function note(text) {
    found.push(text);
    var box = document.getElementById("page-errors");
    if (box) { box.textContent = found.join("\n"); box.hidden = false; }
  }
  window.addEventListener("error", function (event) {
    note("error: " + (event.message || (event.target && (event.target.src || event.target.href)) || "unknown"));
  }, true);
  window.addEventListener("unhandledrejection", function (event) { note("error: " + event.reason); });
  document.addEventListener("securitypolicyviolation", function (event) {
    note("blocked: " + event.violatedDirective + " " + event.blockedURI);
  });
  ["error", "warn"].forEach(function (level) {
    var original = console[level];
    console[level] = function () {
      note("console." + level + ": " + Array.prototype.join.call(arguments, " "));
      return original.apply(console, arguments);
    };
  });
  window.addEventListener("load", function () {
    var box = document.getElementById("page-errors");
    if (box && found.length) { box.textContent = found.join("\n"); box.hidden = false; }
    void document.body.offsetHeight; // style and layout done: the time to open, for the benchmark
    document.body.setAttribute("data-open-ms", performance.now().toFixed(1));
  });
})();
