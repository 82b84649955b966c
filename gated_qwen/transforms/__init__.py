"""Transforms of checkpoints: conversion of a stock Qwen3 into Qwen3Gated, and export to a stock
architecture. Both stream tensors from a source checkpoint to a new folder."""
