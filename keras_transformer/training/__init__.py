"""Training: the settings, the job as stages (`job.train`), the guard that
`model.fit` calls after each update, the optimizer, strategies and batch plan,
checkpoint averaging and the training plots."""
