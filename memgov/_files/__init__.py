"""Folders and files in a ledger other users write in: checked walks (trust), owned descriptors,
locks, whole writes, this user's private store (flock). Imports only _base."""
