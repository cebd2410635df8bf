// What both pages share: a table cell holding a value as text (never as HTML); "-" for none.
function cell(text, cls) {
  const td = document.createElement("td");
  if (text === null || text === undefined || text === "") {
    td.textContent = "-";
    td.className = cls === "num" ? "num none" : "none";
  } else {
    td.textContent = String(text);
    if (cls) td.className = cls;
  }
  return td;
}
