"""Regressors trained on operator samples: which model a row belongs to (`model_keys`), one fit (`regressor`),
training a set (`training`), loading and answering rows (`models`, `trained_model`), and the answers derived from
other models of the set (`derived`)."""
