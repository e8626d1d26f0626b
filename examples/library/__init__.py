"""A small lending library as a ctu domain (docs/your-domain.md): ``env.domains=[examples.library.domain:load]``."""
