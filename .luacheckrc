-- Policy methods share one signature; an override need not use every argument.
unused_args = false
std = "lua54"
max_line_length = false
files["spec/"] = { std = "+busted" }
files["lua/resty/"] = { std = "luajit" }
