"""Starting policies, made before RL and apart from it: the demonstrations format (demonstrations.py), recording them
(record.py, a command) by scripted experts (experts.py) or scripted plans (plans.py), both reading the page through
page_tree.py, the warm-up that fine-tunes a model on them (warm_up.py, a command), and the tiny LFM2 the tests and CPU
runs start from (tiny_lfm2.py). train.py never imports this package; it takes the model a warm-up wrote."""
