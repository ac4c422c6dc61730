/*
 * Whether the events of the last pointer action landed on what element_check.js found there, and its listener
 * taken off; true where the document they landed in is gone. Where none of them reached the listener, true as
 * Playwright has it (its own check says done), but false in a page where Playwright may have left the check of a
 * pointer action it gave up on (page_actions.py): that check, listening before this one, stopped them.
 */
() => {
  const verdict = window.__pointerActionVerdict;
  delete window.__pointerActionVerdict;
  if (!verdict) return true;  // gone with the document the action left
  const landed = verdict();
  return landed === undefined ? !window.__hitCheckLeftByPlaywright : landed;
}
