// stacx view: the only script. Clicking a view's name in the SQL page's list fills the box.
document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a.view-name");
  if (!a) return;
  ev.preventDefault();
  const box = document.querySelector("textarea[name=q]");
  if (box) { box.value = a.dataset.q; box.focus(); }
});
// Changing a filter of the episodes page applies it at once (the submit button still works).
document.addEventListener("change", (ev) => {
  const form = ev.target.closest("form.filters");
  if (form && ev.target.tagName === "SELECT") form.submit();
});
