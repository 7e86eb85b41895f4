"""The experiment drivers: a configuration in, a results dict out (the time-aware T5 reproduction, the streaming
study, CALM, importance sampling, adaptation)."""
