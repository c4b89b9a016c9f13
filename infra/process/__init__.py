"""A command's process: how it ends (:mod:`infra.process.exit`) and which of its objects'
attributes stay behind when the object travels to another process (:mod:`infra.process.local`).
"""
