# Rewrites CUDA C++ into C++ that emulate.h runs on the CPU (see emulate.h):
#   kernel<<<grid, block[, smem[, stream]]>>>(args)   ->  emu_launch(kernel, grid, block...)(args)
#   extern __shared__ [__align__(n)] T name[];        ->  T* name = (T*)emu_dynamic_shared();
#   __shared__ T name[dims];  (one a line)             ->  static T name[dims]; emu_static_shared(...);
#     (a static variable, made garbage again at each block's first thread to declare it)
# A launch whose <<<...>>> spans lines is joined into one line first (the emulated source then has
# fewer lines than its original); a kernel name may carry template arguments without nested <>.
:join
/<<<[^;]*$/{
/>>>/!{
N
s/\n[ \t]*/ /
bjoin
}
}
s/\([A-Za-z_][A-Za-z0-9_]*\(<[^<>;]*>\)\{0,1\}\)[ ]*<<<\(.*\)>>>[ ]*(/emu_launch(\1, \3)(/g
s/extern __shared__ \(__align__([0-9]*) \)\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\) \([A-Za-z_][A-Za-z0-9_]*\)\[\];/\2* \3 = (\2*)emu_dynamic_shared();/
s/^\([ \t]*\)__shared__ \([A-Za-z_][A-Za-z0-9_:]*\) \([A-Za-z_][A-Za-z0-9_]*\)\(\[[^;]*\]\)\{0,1\};/\1static \2 \3\4; emu_static_shared(\&\3, sizeof(\3));/
