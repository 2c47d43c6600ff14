from thermo.convert import c_to_f, convert, f_to_c

__all__ = ["c_to_f", "convert", "f_to_c"]
