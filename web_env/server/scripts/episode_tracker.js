/*
 * Installed in every page before the page's own scripts. MiniWoB's pages are built to run episode after episode: each
 * episode's generator (genProblem) rebuilds the task's area (#wrap) from whatever the last episode left there. What it
 * does not rebuild, this script puts back as a fresh load would have it (restore), from what it noted:
 * - from the page's load (the first episode's start): each form control's value, checked and selected state, and each
 *   element's scroll offsets;
 * - from each episode's start: the listeners it attaches to the nodes that outlive it, directly or through jQuery
 *   (which keeps its own list behind one listener per element and event, so that a handler added through it may call
 *   no addEventListener at all), and the timers and animation frames it starts; jQuery's running animations are
 *   finished first, and its animation ticker told it has stopped.
 * - from the fresh load's first episode: the nodes outside the task's area that it had empty, with their attributes;
 *   one filled since and hidden is emptied again (a widget's container, which the widget fills when it shows and
 *   leaves filled when it hides: jQuery UI's datepicker).
 *   Hidden, what is left in them is not in the accessibility tree, but it takes BrowserGym's element ids: the
 *   datepicker's 97 nodes shifted its ids by 97 in the next episode.
 * What a restart cannot put back, it detects: once the next episode's generator has run, the nodes outside the task's
 * area, what of them is on screen, and how many jQuery handlers the loaded page's nodes hold, must be what the fresh
 * load gave (unlikeFreshLoad), or the page is loaded afresh. A datepicker, colour picker or menu left open by the last
 * episode shows on screen; a widget the generator makes once and keeps loses the handlers the restart took off.
 */
(() => {
  const add = EventTarget.prototype.addEventListener, remove = EventTarget.prototype.removeEventListener;
  const setTimeout_ = window.setTimeout, setInterval_ = window.setInterval, frame_ = window.requestAnimationFrame;
  const capture = (options) => typeof options === "boolean" ? options : Boolean(options && options.capture);
  let survivors = null, listeners = [], handlers = [], timers = [], frames = [], asLoaded = null;
  // What the fresh load had outside the task's area, showed and bound once its first episode began.
  let freshOutside = "", freshScreen = "", freshHandlers = "", loadedEmpty = [];
  EventTarget.prototype.addEventListener = function (type, listener, options) {
    if (survivors && survivors.has(this)) listeners.push([this, type, listener, capture(options)]);
    return add.call(this, type, listener, options);
  };
  EventTarget.prototype.removeEventListener = function (type, listener, options) {
    const match = ([t, y, l, c]) => t === this && y === type && l === listener && c === capture(options);
    listeners = listeners.filter((entry) => !match(entry));
    return remove.call(this, type, listener, options);
  };
  window.setTimeout = function () { const id = setTimeout_.apply(this, arguments); timers.push(id); return id; };
  window.setInterval = function () { const id = setInterval_.apply(this, arguments); timers.push(id); return id; };
  window.requestAnimationFrame = function () { const id = frame_.apply(this, arguments); frames.push(id); return id; };
  const trackJQuery = ($) => {
    const addHandler = $.event.add;
    $.event.add = function (element, types, handler, data, selector) {
      if (survivors && survivors.has(element)) {
        const own = handler && handler.handler;  // jQuery also takes {handler, selector}
        handlers.push([element, types, own ? handler.handler : handler, own ? handler.selector : selector]);
      }
      return addHandler.apply(this, arguments);
    };
    $.event.tracked = true;
  };
  // Form controls as loaded: BrowserGym's observations write each element's value and checked state into its
  // attributes, and typing into a control marks its value as the user's, which the page's own later writes to the
  // control's default (a text area's text, an input's value attribute) no longer show through. Both go back to how
  // the page loaded them: the attributes, then the form's reset algorithm (run through a form made for it), then any
  // value the page's own scripts had set at load.
  const CONTROLS = "input:not([type=file]), textarea, select";
  const setByScript = (e) => e instanceof HTMLOptionElement ? (e.selected !== e.defaultSelected ? [e.selected] : null)
    : e.matches("input, textarea") && (e.value !== e.defaultValue || e.checked !== e.defaultChecked)
      ? [e.value, e.checked] : null;
  const keep = () => [...document.querySelectorAll("*")]
    .map((e) => [e, e.getAttribute("value"), e.getAttribute("checked"), setByScript(e), e.scrollTop, e.scrollLeft]);
  const setAttribute = (e, name, value) => value === null ? e.removeAttribute(name) : e.setAttribute(name, value);
  const resetControls = (controls) => {
    const form = document.createElement("form");
    form.id = "browser-rl-reset";
    document.body.append(form);
    const owners = controls.map((e) => [e, e.getAttribute("form")]);
    controls.forEach((e) => e.setAttribute("form", form.id));
    form.reset();
    owners.forEach(([e, owner]) => setAttribute(e, "form", owner));
    form.remove();
  };
  const putBack = () => {
    for (const [e, value, checked] of asLoaded) {
      setAttribute(e, "value", value);
      setAttribute(e, "checked", checked);
    }
    resetControls(asLoaded.map(([e]) => e).filter((e) => e.isConnected && e.matches(CONTROLS)));
    for (const [e, , , state, top, left] of asLoaded) {
      if (state && e instanceof HTMLOptionElement) e.selected = state[0];
      else if (state) [e.value, e.checked] = state;
      if (e.scrollTop !== top || e.scrollLeft !== left) e.scrollTo(left, top);
    }
  };
  const label = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "")
    + (typeof e.className === "string" && e.className.trim() ? "." + e.className.trim().split(/\s+/)[0] : "");
  const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
  const outside = () => {
    const wrap = document.getElementById("wrap");
    return [...document.body.querySelectorAll("*")].filter((e) => !(wrap && wrap.contains(e)));
  };
  // The labels of those of `nodes` whose parent is not among them, once each.
  const outermost = (nodes) => [...new Set(nodes.filter((e) => !nodes.includes(e.parentElement)).map(label))];
  const emptyAgain = () => {
    for (const [e, attributes] of loadedEmpty) {
      if (!e.isConnected || !e.hasChildNodes() || shown(e)) continue;  // one on screen is unlikeFreshLoad's to see
      e.replaceChildren();
      for (const name of e.getAttributeNames()) e.removeAttribute(name);
      for (const [name, value] of attributes) e.setAttribute(name, value);
    }
  };
  // How many jQuery handlers of each event each node of the loaded page holds. A widget the task's generator makes
  // once and keeps (jQuery UI's autocomplete, say) binds its handlers once: a restart that took them off would
  // leave the widget dead, and the generator's next run does not bind them again.
  const jqueryHandlers = () => {
    const $ = window.jQuery;
    if (!$ || !$._data) return "";
    return [window, document, ...asLoaded.map(([e]) => e)].map((e) => Object.entries($._data(e, "events") || {})
      .map(([type, bound]) => `${type} ${bound.length}`).join(",")).join(";");
  };
  const begin = () => {
    asLoaded = asLoaded || keep();
    if (window.jQuery && window.jQuery.event && !window.jQuery.event.tracked) trackJQuery(window.jQuery);
    survivors = new WeakSet([window, document, ...document.querySelectorAll("*")]);
    listeners = []; handlers = []; timers = []; frames = [];
  };
  window.__episode = {
    begin,
    noteFreshLoad() {
      const nodes = outside();
      freshOutside = nodes.map(label).join(" ");
      freshScreen = nodes.filter(shown).map(label).join(" ");
      freshHandlers = jqueryHandlers();
      loadedEmpty = nodes.filter((e) => !e.hasChildNodes())
        .map((e) => [e, e.getAttributeNames().map((name) => [name, e.getAttribute(name)])]);
    },
    restore() {
      const $ = window.jQuery;
      if ($ && $.timers && $.timers.length) $($.timers.map((timer) => timer.elem)).finish();
      for (const [element, types, handler, selector] of handlers.reverse()) {
        $.event.remove(element, types, handler, selector);
      }
      for (const [target, type, listener, capture] of listeners) remove.call(target, type, listener, capture);
      timers.forEach((id) => { clearTimeout(id); clearInterval(id); });
      frames.forEach((id) => cancelAnimationFrame(id));
      if ($ && $.fx) $.fx.stop();  // its ticker was one of the timers: the next animation starts it again
      putBack();
      emptyAgain();
    },
    // Why the page, its next episode begun, is not what the fresh load gave; "" if it is, as far as can be seen.
    unlikeFreshLoad() {
      const nodes = outside(), onScreen = nodes.filter(shown);
      if (onScreen.map(label).join(" ") !== freshScreen) {
        return `the last episode left on screen, outside the task's area: ${outermost(onScreen).join(", ")}`;
      }
      if (nodes.map(label).join(" ") !== freshOutside) {
        const fresh = new Set(freshOutside.split(" "));
        const extra = nodes.filter((e) => !fresh.has(label(e)));
        const named = outermost(extra).join(", ") || "no new kind of node, but other numbers or another order of them";
        return `the last episode left nodes outside the task's area that a fresh load has not: ${named}`;
      }
      if (jqueryHandlers() !== freshHandlers) return "the page's jQuery handlers are not those of the fresh load";
      return "";
    },
  };
  window.addEventListener("load", () => setTimeout_(begin, 0));  // the first episode begins after the page's onload
})();
