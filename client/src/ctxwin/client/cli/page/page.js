(function () {
  var data = JSON.parse(document.getElementById("ctxwin-data").textContent);
  var select = document.getElementById("turn");
  var items = document.querySelectorAll("#conversation li.msg");
  var fold = document.getElementById("fold");
  var mark = document.getElementById("selected");
  function fmt(n) { return n.toLocaleString("en-US"); }
  function show(k) {
    var t = data.turns[k], end = t[1], view = data.views[t[2]];
    var sent = 0, tokens = 0;
/* range */
    function dropped(i) {
      for (var g = 0; g < view.gaps.length; g++) {
        var gap = data.gaps[view.gaps[g]];
        if (gap[0] <= i && i <= gap[1]) { return true; }
      }
      return false;
    }
    var lines = document.querySelectorAll("#conversation li.gap");
    for (var n = 0; n < lines.length; n++) {
      lines[n].hidden = view.gaps.indexOf(+lines[n].dataset.gap) < 0;
    }
    for (var n = 0; n < items.length; n++) {
      var li = items[n], i = +li.dataset.i, v = li.dataset.v;
      var want = view.altered[i];
      var inView = i < end && (i < 2 || (i >= view.keep && !dropped(i)));
      var on = inView && (v === undefined ? want === undefined : +v === want);
      li.hidden = !on;
      if (on) { sent++; tokens += +li.dataset.t; }
    }
    var last = Math.min(view.last, end - 1);
    if (last >= 2) {
      var chars = 0, dropped = 0;
      for (var j = 2; j <= last; j++) { chars += data.chars[j]; dropped += data.tokens[j]; }
      document.getElementById("fold-text").textContent = "messages 2-" + last +
        " dropped, " + fmt(chars) + " characters (" + fmt(dropped) + " tokens)";
      fold.hidden = false;
    } else {
      fold.hidden = true;
    }
/* order */
    var list = document.getElementById("conversation"), keyed = {}, order = view.order;
    for (var n = 0; n < items.length; n++) {
      var item = items[n];
      item.hidden = true;
      keyed[item.dataset.i + "/" + (item.dataset.v === undefined ? "" : item.dataset.v)] = item;
    }
    fold.hidden = true;
    for (var p = 0; p <= order.length; p++) {
      if (view.fold && view.fold[0] === p) {
        document.getElementById("fold-text").textContent = view.fold[1];
        fold.hidden = false;
        list.appendChild(fold);
      }
      if (p === order.length) { break; }
      var li = keyed[order[p][0] + "/" + (order[p][1] === null ? "" : order[p][1])];
      li.hidden = false;
      list.appendChild(li);
      sent++; tokens += +li.dataset.t;
    }
/* end */
    document.getElementById("view-summary").textContent = sent + " of " + end +
      " messages sent, " + fmt(tokens) + " tokens counted" +
      (t[3] === null ? "" : " (calibrated estimate " + fmt(t[3]) + ")");
    select.value = String(k);
    if (mark) {
      var hit = document.querySelector('.hit[data-turn="' + t[0] + '"]');
      if (hit) {
        var x = (+hit.getAttribute("x") + (+hit.getAttribute("width")) / 2).toFixed(1);
        mark.setAttribute("x1", x); mark.setAttribute("x2", x);
      }
    }
  }
  function pick(turn) {
    for (var k = 0; k < data.turns.length; k++) {
      if (data.turns[k][0] === turn) { show(k); return true; }
    }
    return false;
  }
  select.addEventListener("change", function () { show(+select.value); });
  document.addEventListener("click", function (e) {
    var el = e.target.closest ? e.target.closest("[data-turn]") : null;
    if (el) { e.preventDefault(); pick(+el.getAttribute("data-turn"));
      history.replaceState(null, "", "#turn=" + el.getAttribute("data-turn")); }
  });
  var m = /turn=(\d+)/.exec(location.hash);
  if (!(m && pick(+m[1]))) { show(data.turns.length - 1); }
})();
