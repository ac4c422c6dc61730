/*
 * Whether the events of the last pointer action landed on what element_check.js found there, and its listener
 * taken off; true where the document they landed in is gone.
 */
() => {
  const verdict = window.__pointerActionVerdict;
  delete window.__pointerActionVerdict;
  return verdict ? verdict() : true;  // gone with the document the action left
}
