"""The measuring floor: the one way duocal asks a model under a plan and scores it, used by `eval`, `profile`,
`tune` and calibration alike: a chat answer and its rule (`chat_answer`), greedy answers after a prefill and a
question's start (`decoding`), text windows and their losses (`text_windows`), the positions limit and progress
(`limits`), the answer loss when a head streams (`answer_loss`) and heads ordered plan by plan on it
(`nested_order`)."""
