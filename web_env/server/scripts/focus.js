/*
 * Playwright's Locator.focus in one call in the page, as its injected script's focusNode does it in Chromium: the one
 * element with the bid focused (twice, as Playwright does); false, with nothing done, where no element or several
 * carry the bid, for BrowserGym's code to run and say so. (focusNode's blur before a contenteditable target works
 * around Firefox; tests/test_page_actions.py's contenteditable case finds the same outcome without it.) Playwright
 * waits for nothing else before a focus, so its 500 ms deadline only ever passes while the page's own focus handlers
 * run (a date picker builds its calendar): on a busy machine it passed with the element focused, and the action was
 * reported failed.
 */
(bid) => {
  const found = document.querySelectorAll(`[bid="${CSS.escape(bid)}"]`);
  if (found.length !== 1) return false;
  found[0].focus();
  found[0].focus();
  return true;
}
