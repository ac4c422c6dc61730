/* The page's storage emptied, as a fresh browser context has it; pages that refuse storage are left alone. */
() => { try { localStorage.clear(); sessionStorage.clear(); } catch (e) {} }
