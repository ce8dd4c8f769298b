// Kith dashboard: ask before a form marked data-confirm does something hard to undo
// (removing a root drops its index). Without JavaScript the form simply submits.
document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
