/*
 * Playwright's Locator.select_option of one option, named by its value or its label, in one call in the page, as its
 * injected script's checkElementStates(["visible", "enabled"]) and selectOptions do it: the select's selection
 * cleared, the first option so named selected, then the select's input and change events sent (untrusted, as
 * Playwright sends them). False, with nothing done, where the check cannot vouch for the same outcome (not exactly
 * one element with the bid, an element that is not the select itself, not visible, possibly disabled, no such
 * option), for BrowserGym's code to run, with its waits and errors. Visible and enabled are asked as element_check.js
 * asks them, which is more than Playwright asks, never less. BrowserGym's call is eight round trips to Chromium under
 * a 500 ms deadline, which a busy machine ran out of before the select was looked at (a CI run's clinic booking).
 */
([bid, wanted]) => {
  const found = document.querySelectorAll(`[bid="${CSS.escape(bid)}"]`);
  if (found.length !== 1 || found[0].nodeName !== "SELECT") return false;
  const select = found[0], style = getComputedStyle(select), box = select.getBoundingClientRect();
  if (style.visibility !== "visible") return false;
  if (!select.checkVisibility({ checkOpacity: false, checkVisibilityCSS: false })) return false;
  if (box.width <= 0 || box.height <= 0) return false;
  if (select.closest("[disabled], [aria-disabled]")) return false;
  const option = [...select.options].find((o) => o.value === wanted || o.label === wanted);
  if (!option) return false;
  select.value = undefined;
  option.selected = true;
  select.dispatchEvent(new Event("input", { bubbles: true, composed: true }));
  select.dispatchEvent(new Event("change", { bubbles: true }));
  return true;
}
