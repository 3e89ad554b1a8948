// nodeplug console: live updates of the page's view from server-sent events,
// ages that count up, the trace waterfall's span selection, and the traces
// filter, which follows what is typed without a reload and keeps the page's
// URL saying it, so that a filtered view can be linked and reloaded.
(function () {
  'use strict';
  var live = document.getElementById('live');
  var conn = document.getElementById('conn');
  var selected = null;

  function fmtAge(s) {
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + (s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h' + Math.floor(s % 3600 / 60) + 'm';
    return Math.floor(s / 86400) + 'd' + Math.floor(s % 86400 / 3600) + 'h';
  }
  function ages() {
    var now = Date.now();
    document.querySelectorAll('time[data-age]').forEach(function (t) {
      var d = Date.parse(t.getAttribute('datetime'));
      if (!isNaN(d)) t.textContent = fmtAge((now - d) / 1000);
    });
  }
  function say(text) { if (conn) conn.textContent = text; }

  // select shows the attributes of span id (or none).
  function select(id) {
    selected = id;
    document.querySelectorAll('button[data-span]').forEach(function (b) {
      b.setAttribute('aria-expanded', b.dataset.span === id ? 'true' : 'false');
    });
    document.querySelectorAll('section.attrs').forEach(function (s) {
      s.hidden = s.id !== 'attrs-' + id;
    });
    var none = document.getElementById('nospan');
    if (none) none.hidden = !!(id && document.getElementById('attrs-' + id));
  }

  if (live) {
    live.addEventListener('click', function (e) {
      var b = e.target.closest('button[data-span]');
      if (b) select(b.dataset.span === selected ? null : b.dataset.span);
    });
    live.addEventListener('keydown', function (e) {
      var b = e.target.closest && e.target.closest('button[data-span]');
      if (!b || (e.key !== 'ArrowDown' && e.key !== 'ArrowUp')) return;
      var all = Array.prototype.slice.call(live.querySelectorAll('button[data-span]'));
      var next = all[all.indexOf(b) + (e.key === 'ArrowDown' ? 1 : -1)];
      if (next) { next.focus(); e.preventDefault(); }
    });
  }

  var es = null;
  function connect(url) {
    if (es) es.close();
    es = new EventSource(url);
    es.addEventListener('update', function (e) {
      var focused = document.activeElement && document.activeElement.id;
      live.innerHTML = e.data;
      if (selected) select(selected);
      if (focused && live.contains(document.getElementById(focused))) document.getElementById(focused).focus();
      ages();
      say('live · updated ' + new Date().toLocaleTimeString());
    });
    es.onopen = function () { say('live'); };
    es.onerror = function () { say('reconnecting…'); };
  }

  if (live && live.dataset.events && window.EventSource) {
    connect(live.dataset.events);
  } else {
    say('static (no live updates)');
  }

  // The traces filter: the form's values, without the empty ones, are
  // the page's query and its event stream's.
  var form = document.getElementById('filter');
  if (form && live && es) {
    var base = live.dataset.events.split('&')[0];
    var timer = null;
    var apply = function () {
      clearTimeout(timer);
      var q = new URLSearchParams();
      Array.prototype.forEach.call(form.elements, function (el) {
        if (el.name && el.value.trim() !== '') q.set(el.name, el.value.trim());
      });
      var qs = q.toString();
      if (qs === location.search.replace(/^\?/, '')) return;
      history.replaceState(null, '', location.pathname + (qs ? '?' + qs : ''));
      live.dataset.events = base + (qs ? '&' + qs : '');
      say('filtering…');
      connect(live.dataset.events);
    };
    var later = function () { clearTimeout(timer); timer = setTimeout(apply, 300); };
    form.addEventListener('input', function (e) { if (e.target.tagName === 'INPUT') later(); });
    form.addEventListener('change', apply);
    form.addEventListener('submit', function (e) { e.preventDefault(); apply(); });
    var clear = document.getElementById('clear');
    if (clear) clear.addEventListener('click', function (e) {
      e.preventDefault();
      Array.prototype.forEach.call(form.elements, function (el) { if (el.name) el.value = ''; });
      apply();
    });
  }
  ages();
  setInterval(ages, 1000);
})();
