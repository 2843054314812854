-- dstrain 0.1.0 for Lmod. Installed by `cmake --install BUILD --prefix PREFIX` as
-- PREFIX/share/modulefiles/dstrain/0.1.0.lua, where it finds PREFIX from its own location; used
-- from a source checkout (module use modulefiles) it points at the checkout's install/ folder
-- (cmake --install build --prefix install). DSTRAIN_PREFIX overrides both.
help([[
dstrain trains DeepSeek-style language models on clusters (DP x PP, NCCL, HDF5 checkpoints).
  dstrain train --config input/demo.ini ...       dstrain --help
Job scripts: $DSTRAIN_ROOT/share/dstrain/jobs; presets: $DSTRAIN_ROOT/share/dstrain/input.
]])
whatis("Name: dstrain")
whatis("Version: 0.1.0")
whatis("Description: trains DeepSeek-style language models with MPI, NCCL, LibTorch and parallel HDF5")

local here = myFileName()
local root = os.getenv("DSTRAIN_PREFIX")
if not root or root == "" then
  local installed = here:match("^(.*)/share/modulefiles/dstrain/[^/]+$")
  root = installed or (here:match("^(.*)/modulefiles/dstrain/[^/]+$") .. "/install")
end

-- The site's modules for what dstrain was built with, where the site has them.
for _, name in ipairs({"cuda", "openmpi", "hdf5"}) do
  if isAvail(name) and not isloaded(name) then load(name) end
end

setenv("DSTRAIN_ROOT", root)
setenv("DSTRAIN_JOBS_DIR", pathJoin(root, "share/dstrain/jobs"))
prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("LD_LIBRARY_PATH", pathJoin(root, "lib"))
-- Parallel HDF5 on Lustre and NFS.
setenv("HDF5_USE_FILE_LOCKING", "FALSE")
