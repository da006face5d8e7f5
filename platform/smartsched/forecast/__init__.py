"""Load forecasting: series data, baselines, an LSTM with intervals, evaluation."""
