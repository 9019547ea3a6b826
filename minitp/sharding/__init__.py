"""From a plain model to shards and back, for every axis alike.

* `plan`: plan tables (dotted module-name patterns) and replacing the modules they match;
* `tags`: what each parameter carries (its split dim, padded size, partial gradient);
* `dense`: the dense state rebuilt from shards by reading their tags.
"""
