"""The command line tools: ``ctxwin``, its replay and the page of what the model saw."""
