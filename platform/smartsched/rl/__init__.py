"""Reinforcement learning over the twin: gymnasium env, RLModule, RLlib training, rl: profile."""
