/*
 * A new episode in the page the task has loaded, as MiniWoB's own instances start one (end the running episode, seed,
 * startEpisodeReal), with what BrowserGym's setup does besides, and what else a fresh load would have cleared (see
 * EPISODE_TRACKER): BrowserGym's element ids, storage and focus. [ready, goal], or why the page must be loaded afresh.
 */
([seed, maxTime]) => {
  if (!window.__episode || !window.core || !window.removeDisplay) return "the page has no MiniWoB episode to restart";
  core.endEpisode(0);
  window.__episode.restore();
  delete window.browsergym_elem_counter;
  delete window.browsergym_frame_id_generator;
  for (const name of ["bid", "browsergym_visibility_ratio", "browsergym_set_of_marks"]) {
    for (const element of document.querySelectorAll(`[${name}]`)) element.removeAttribute(name);
  }
  try { localStorage.clear(); sessionStorage.clear(); } catch (e) {}
  window.focus();  // the document may have lost the focus (a Tab past its last element), as a new one has it
  if (document.activeElement && document.activeElement.blur) document.activeElement.blur();
  window.__episode.begin();
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  const unlike = window.__episode.unlikeFreshLoad();
  if (unlike) return unlike;
  return [WOB_TASK_READY, core.getUtterance()];
}
