//! Runs a small graph (a matrix product and an RMS norm) on the CPU with `rocmforge-ggml-graph` built
//! without features, and checks the product against a plain loop.

use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, WeightBytes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (k, n, m) = (8usize, 3usize, 2usize);
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[k, m])?;
    let w = g.weight("w", DType::F32, &[k, n])?;
    let y = g.mul_mat(w, x)?;
    let z = g.rms_norm(y, 1e-6)?;
    g.mark_output(y)?;
    g.mark_output(z)?;

    let wv: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let xv: Vec<f32> = (0..k * m).map(|i| (i % 3) as f32).collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let mut exec = Executor::new(CpuBackend::new(1)?);
    exec.bind_weight("w", DType::F32, &[k, n], WeightBytes::from_vec(bytes(&wv)))?;
    exec.run(&g, &[(x, &bytes(&xv))])?;

    let got = exec.output_f32(y)?;
    // ggml's convention: y[j, c] = sum over i of w[i, j] * x[i, c], first dimension fastest.
    let want: Vec<f32> = (0..m)
        .flat_map(|c| (0..n).map(move |j| (c, j)))
        .map(|(c, j)| (0..k).map(|i| wv[j * k + i] * xv[c * k + i]).sum())
        .collect();
    if got != want {
        return Err(format!("mul_mat gave {got:?}, expected {want:?}").into());
    }
    println!("mul_mat {got:?}\nrms_norm {:?}", exec.output_f32(z)?);
    Ok(())
}
