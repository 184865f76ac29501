"""Lambda entry points: one thin module per function (parse -> call the core -> return)."""
