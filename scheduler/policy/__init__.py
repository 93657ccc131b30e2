"""Pure decisions, by idea: ``memory`` (what a job takes, the batch that fits), ``placement`` (which device, which
wave), ``timing`` (how long), ``planning`` (advise and the dry run), ``running`` (the run loop and the budget), and
``ensemble`` (the blend and the submission)."""
