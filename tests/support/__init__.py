"""What tests share besides fixtures: the brokers and containers of the suite, the pulled
model, reading topics, and small builders and fakes. Tests import from here (or from a
folder's helper modules), never from another test module."""
